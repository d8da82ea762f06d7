"""An operator's set of one consumer's progress (`Cluster.SetConsumerState`, used by `raftlog
audit repair`): committed through the metadata group by the stream's primary, the one node that
knows the stream's commit seq and serves the consumer. Every other node forwards the call there.

On the primary, in this order:
1. the values are checked against the stream's commit seq (PAST_COMMITTED_END): a consumer
   never points past what the stream committed;
2. the consumer is held out of service (consumers/manager.py `replace_committed`): its callers
   get CATCHING_UP, and its save in flight lands before the set, never after it;
3. a ConsumerStateSet is committed with that commit seq, this primary's fence epoch and the
   caller's expected state. The state machine checks all three again when it applies the
   command: CONSUMER_CHANGED when the consumer moved since the caller looked, STALE_EPOCH when
   another primary took over meanwhile;
4. the consumer is served again from the committed state, whether the set was committed or not.

Every member applies the same command, so every copy of the metadata holds the new values, and a
later primary loads them after a failover. A node keeps no other copy of a consumer's state: its
own consumer store is unused in a cluster (replication/service.py `RepairConsumer` removes a
record found there).
"""

from __future__ import annotations

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.stream import ROLE_PRIMARY
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import canonical, route
from raftlog.node.ops.metadata import Confirms
from raftlog.node.ops.route import Route
from raftlog.node.transport.calls import Call
from raftlog.raft import commands
from raftlog.v1 import cluster_pb2


def check_within(request: cluster_pb2.SetConsumerStateRequest, *, commit_seq: int) -> None:
    """PAST_COMMITTED_END when a value of the request lies past `commit_seq`."""
    past = [f"{name} {value}" for name, value in (
        ("ack floor", request.ack_floor), ("delivered seq", request.delivered_seq),
        ("acked seq", max(request.acked, default=0))) if value > commit_seq]
    if past:
        raise RaftlogError(Reason.PAST_COMMITTED_END, f"{', '.join(past)} past the commit seq "
                           f"{commit_seq} of {request.stream!r}", stream=request.stream,
                           consumer=request.consumer, commit_seq=commit_seq)


class ConsumerStateOps:
    def __init__(self, *, engine: StreamEngine, manager: ConsumerManager, cluster: ClusterNode,
                 metadata: Confirms, where: Route) -> None:
        self._engine = engine
        self._manager = manager
        self._cluster = cluster
        self._metadata = metadata
        self._where = where

    async def set_state(self, request: cluster_pb2.SetConsumerStateRequest, via: Call
                        ) -> cluster_pb2.SetConsumerStateResponse:
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_name(request.consumer, what="consumer")

        async def confirmed() -> cluster_pb2.SetConsumerStateResponse:
            try:
                return await self._set_here(request, via)
            except RaftlogError as err:
                raise await self._metadata.confirm(err, stream=request.stream,
                                                   consumer=request.consumer, via=via) from None

        return await route.unary(self._where, self._where.primary(request.stream),
                                 canonical.SET_CONSUMER_STATE, request, via, confirmed)

    async def _set_here(self, request: cluster_pb2.SetConsumerStateRequest, via: Call
                        ) -> cluster_pb2.SetConsumerStateResponse:
        name = request.stream
        if name not in self._cluster.state.streams:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {name!r}",
                               stream=name)
        local = self._engine.streams.get(name)
        if local is None or local.role != ROLE_PRIMARY or local.deposed is not None:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node does not serve {name!r} as its "
                               "primary (yet); retry", stream=name,
                               retry_after_ms=limits.catching_up_retry_after_ms)
        commit_seq = local.commit_seq
        check_within(request, commit_seq=commit_seq)
        command = commands.consumer_state_set(
            stream=name, consumer=request.consumer, ack_floor=request.ack_floor,
            acked=request.acked, delivered_seq=request.delivered_seq, commit_seq=commit_seq,
            fence_epoch=local.record.epoch,
            expect=request.expect if request.HasField("expect") else None)

        async def commit() -> raft_pb2.RaftResult:
            # A set replaces the progress, floor included: proposed after its caller gave up
            # (it waited here for a save in flight), it could land after a retry of it and
            # after acks that followed, and undo them. So a late set changes nothing.
            if via.expired():
                raise RaftlogError(Reason.TIMEOUT, f"the caller's deadline passed before the "
                                   f"set of {request.consumer!r} on {name!r} was proposed; "
                                   "nothing changed", stream=name, consumer=request.consumer)
            return await self._cluster.propose(command, timeout_s=via.remaining_s())

        result = await self._manager.replace_committed(name, request.consumer, commit)
        return cluster_pb2.SetConsumerStateResponse(changed=result.changed,
                                                    raft_index=result.index,
                                                    commit_seq=commit_seq)
