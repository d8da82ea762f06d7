"""The replica's side of one stream, as the replication package sees it.

The rules live in the engine, which applies them: checking a primary's batch in
node/engine/replica_batch.py, applying it to the local copy and fencing in
node/engine/stream_replica.py (`Stream.accept_replicated`, `Stream.fence`), the roles in
node/engine/stream_core.py. This module names them for the primary's side (primary.py) and for
the service (service.py). The bounds every batch keeps are the `replication_*` names in
base/limits.py, which the primary keeps when it builds a batch.
"""

from __future__ import annotations

from raftlog.node.engine.replica_batch import check_batch, epoch_of, zlib_crc
from raftlog.node.engine.stream_core import ROLE_PRIMARY, ROLE_REPLICA

__all__ = ["ROLE_PRIMARY", "ROLE_REPLICA", "check_batch", "epoch_of", "zlib_crc"]
