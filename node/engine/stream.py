"""One stream on one node: `Stream`, the object the engine keeps per stream, and its replica
side (taking a primary's batches, fencing).

`Stream` puts together the concerns, each in its own module:
- `stream_core`      the record, counters, commit seq and role, the storage primitives;
- `stream_reads`     reads, and what the consumers read through (`StreamLog`, log.py);
- `stream_retention` limits, age expiry, removal and purges;
- `stream_publish`   checks, seq assignment and the commit wait of a publish.
The replica side's rules are in node/replication/replica.py.
"""

from __future__ import annotations

from raftlog.internal import replication_pb2
from raftlog.node.engine.stream_publish import StreamPublishing
from raftlog.node.engine.stream_reads import StreamReads
from raftlog.node.replication import replica as stream_replica
from raftlog.node.replication.replica import ROLE_PRIMARY, ROLE_REPLICA

__all__ = ["ROLE_PRIMARY", "ROLE_REPLICA", "Stream"]


class Stream(StreamPublishing, StreamReads):
    """One stream on this node (see the module docstring)."""

    def accept_replicated(self, request: replication_pb2.ReplicateRequest) -> int:
        """Applies a primary's batch; see `stream_replica.accept_replicated`."""
        return stream_replica.accept_replicated(self, request)

    async def fence(self, epoch: int) -> None:
        """Refuses batches below `epoch` from now on (durable on return)."""
        if self.fence_unsynced(epoch):
            await self._committer.durable()

    def fence_unsynced(self, epoch: int) -> bool:
        """Refuses batches below `epoch` from now on; written, durable with the next group
        commit. True when the fence moved."""
        return stream_replica.fence_unsynced(self, epoch)

    def replica_state(self) -> tuple[int, int, int, int]:
        """(epoch, first_seq, last_seq, commit_seq) of the local copy."""
        return self.record.epoch, self.record.first_seq, self.record.last_seq, self._commit_seq
