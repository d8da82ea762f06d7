"""Answering NOT_FOUND only when sure (cluster mode). A node that lags the metadata group (it
restarted and has not caught up, or it lost the leader) may simply not have applied the command
that created a stream or consumer yet; it must not tell a client that the thing does not exist.

`ExistenceCheck.confirm` runs on the error path only, when a per-stream call served here found
no stream or consumer, so a call that finds what it looks for pays nothing:
1. this node's metadata has not caught up once since start, or the group has no leader: the
   answer is CATCHING_UP (UNAVAILABLE, with retry_after_ms), never NOT_FOUND;
2. the committed state has the stream (and the consumer) that the local engine or consumer
   manager lacks: the local copy is brought in line (`ClusterNode.reconcile`; a consumer missing
   from a stream led here is adopted from the committed state) and the answer is CATCHING_UP,
   so the client's retry finds it;
3. neither has it: a Raft barrier is committed, after which every command committed before the
   call is applied here (a lagging follower catches up); if the state now has it, as in 2; else
   the NOT_FOUND stands. A barrier that cannot commit (no quorum) is CATCHING_UP.

The operations (node/ops/raft_first.py) run the check on a per-stream call's failure.
"""

from __future__ import annotations

import logging

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.engine.stream import ROLE_PRIMARY

log = logging.getLogger(__name__)

NOT_FOUND_REASONS = frozenset({Reason.STREAM_NOT_FOUND, Reason.CONSUMER_NOT_FOUND})


def catching_up(stream: str, why: str) -> RaftlogError:
    return RaftlogError(Reason.CATCHING_UP, f"{why}; retry", stream=stream,
                        retry_after_ms=limits.catching_up_retry_after_ms)


class ExistenceCheck:
    """Confirms a STREAM_NOT_FOUND / CONSUMER_NOT_FOUND before a client sees it."""

    def __init__(self, cluster: ClusterNode) -> None:
        self._cluster = cluster

    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str,
                      timeout_s: float | None) -> RaftlogError:
        """What to answer instead of `error`: `error` itself once the absence is confirmed,
        else CATCHING_UP. Errors other than the two NOT_FOUNDs pass through."""
        if error.reason not in NOT_FOUND_REASONS or not stream:
            return error
        if error.reason is Reason.STREAM_NOT_FOUND:
            consumer = ""
        if not self._cluster.caught_up() or self._cluster.group.leader_address() is None:
            return catching_up(stream, "this node has not caught up with the cluster's "
                               "metadata and cannot tell whether "
                               f"{_what(stream, consumer)} exists")
        if self._committed(stream, consumer):
            return await self._repair(stream, consumer)
        try:
            await self._cluster.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                        timeout_s=timeout_s)
        except RaftlogError as exc:
            return catching_up(stream, f"could not confirm with the metadata group that "
                               f"{_what(stream, consumer)} does not exist ({exc.message})")
        if self._committed(stream, consumer):
            return await self._repair(stream, consumer)
        return error

    def _committed(self, stream: str, consumer: str) -> bool:
        with self._cluster.group.read_state() as state:
            if stream not in state.streams:
                return False
            return not consumer or consumer in state.consumers.get(stream, {})

    async def _repair(self, stream: str, consumer: str) -> RaftlogError:
        """The committed state has it and this node does not (yet): brings the local copy in
        line; the client's retry finds it (or is routed to the stream's primary)."""
        cluster = self._cluster
        try:
            await cluster.reconcile(stream)
            if consumer and self._leads(stream):
                cluster.consumers.adopt(stream, consumer)
        except RaftlogError as exc:
            log.info("bringing %s in line failed: %s", _what(stream, consumer), exc)
        return catching_up(stream, f"{_what(stream, consumer)} exists in the cluster; this node "
                           "is still bringing its copy in line")

    def _leads(self, stream: str) -> bool:
        local = self._cluster.engine.streams.get(stream)
        assignment = self._cluster.state.streams.get(stream)
        return (local is not None and local.role == ROLE_PRIMARY and assignment is not None
                and assignment.primary == self._cluster.node_id)


def _what(stream: str, consumer: str) -> str:
    return f"consumer {consumer!r} of stream {stream!r}" if consumer else f"stream {stream!r}"
