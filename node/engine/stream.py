"""One stream on one node: `Stream`, the object the engine keeps per stream.

`Stream` puts together the concerns, each in its own module:
- `stream_core`      the record, counters, commit seq and role, the storage primitives;
- `stream_reads`     reads, and what the consumers read through (`StreamLog`, log.py);
- `stream_retention` limits, age expiry, removal and purges;
- `stream_publish`   checks, seq assignment and the commit wait of a publish;
- `stream_replica`   the replica side: a primary's batches (checked by replica_batch.py),
                     fencing;
- `stream_repair`    an audit's repair of a copy this node does not serve (on top of
                     `stream_replica`).
The role constants are re-exported here for the layers above (cluster, replication).
"""

from __future__ import annotations

from raftlog.node.engine.stream_core import ROLE_PRIMARY, ROLE_REPLICA
from raftlog.node.engine.stream_publish import StreamPublishing
from raftlog.node.engine.stream_reads import StreamReads
from raftlog.node.engine.stream_repair import StreamRepair

__all__ = ["ROLE_PRIMARY", "ROLE_REPLICA", "Stream"]


class Stream(StreamPublishing, StreamReads, StreamRepair):
    """One stream on this node (see the module docstring)."""
