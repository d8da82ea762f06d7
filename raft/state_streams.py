"""Streams and their placement in the metadata state machine: create, update, delete,
promotes (failover), and authority overrides (set, clear, pin). Fence epochs only grow; a
stream has one authority, its primary (the handlers `apply` calls).
"""

from __future__ import annotations

from raftlog.base.errors import Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    MetaState,
    Override,
    StreamAssignment,
    cluster_streams_max,
    promotes_max,
)
from raftlog.raft.state_rules import (
    Rejected,
    accepted,
    check_name,
    check_placement,
    check_start_seq,
    index_primary,
    require,
    require_member,
    start_epoch,
    stream_to_change,
)
from raftlog.raft.state_users import check_storage
from raftlog.v1 import types_pb2


def stream_create(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    create = command.stream_create
    name = create.config.name
    check_name(name, what="stream")
    require(name not in state.streams, Reason.STREAM_EXISTS, f"stream {name!r} already exists")
    require(len(state.streams) < cluster_streams_max, Reason.TOO_MANY_STREAMS,
            f"the cluster holds at most {cluster_streams_max} streams")
    replicas = tuple(create.replicas)
    check_placement(state, replicas, create.primary)
    check_storage(state, owner=create.owner, stream=name, max_bytes=create.config.max_bytes)
    epoch = create.fence_epoch or 1
    start_seq = create.epoch_start_seq or 1
    config = types_pb2.StreamConfig()
    config.CopyFrom(create.config)
    stream = StreamAssignment(
        name=name, stream_id=state.next_stream_id, config=config, replicas=replicas,
        primary=create.primary, fence_epoch=epoch, epoch_start_seq=start_seq,
        created_ms=command.now_ms, updated_ms=command.now_ms, epoch_history=[(epoch, start_seq)],
        owner=create.owner,
    )
    state.next_stream_id += 1
    state.streams[name] = stream
    index_primary(state, name, old="", new=stream.primary)
    state.consumers[name] = {}
    state.encoded_streams.pop(name, None)
    return accepted(stream=stream)


def stream_update(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    update = command.stream_update
    stream = stream_to_change(state, update.name)
    if update.HasField("config"):
        require(update.config.name == update.name, Reason.IMMUTABLE_FIELD,
                f"a stream cannot be renamed ({update.name!r} -> {update.config.name!r})")
    replicas = tuple(update.replicas) or stream.replicas
    check_placement(state, replicas, stream.primary)
    changed = replicas != stream.replicas
    if update.HasField("config") and update.config != stream.config:
        check_storage(state, owner=stream.owner, stream=stream.name,
                      max_bytes=update.config.max_bytes)
        stream.config = types_pb2.StreamConfig()
        stream.config.CopyFrom(update.config)
        changed = True
    stream.replicas = replicas
    if changed:
        stream.updated_ms = command.now_ms
    return accepted(changed=changed, stream=stream)


def stream_delete(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    stream = stream_to_change(state, command.stream_delete.name)
    del state.streams[stream.name]  # the override lives in the assignment
    index_primary(state, stream.name, old=stream.primary, new="")
    for consumer_name in state.consumers.pop(stream.name, {}):
        state.encoded_consumers.pop((stream.name, consumer_name), None)
    return accepted(stream=stream)


def stream_promote(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    return accepted(stream=_promote(state, command.stream_promote, now_ms=command.now_ms))


def stream_promotes(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    promotes = command.stream_promotes.promotes
    require(len(promotes) <= promotes_max, Reason.BATCH_TOO_LARGE,
            f"at most {promotes_max} promotes per command")
    result = raft_pb2.RaftResult(ok=True)
    for promote in promotes:
        try:
            _promote(state, promote, now_ms=command.now_ms)
        except Rejected as rejection:
            result.skipped.add(stream=promote.stream, reason=rejection.reason.name)
            continue
        result.updates_applied += 1
        result.changed = True
    return result


def _promote(state: MetaState, promote: raft_pb2.StreamPromote, *, now_ms: int
             ) -> StreamAssignment:
    """One failover; raises Rejected (changing nothing) when a rule forbids it."""
    stream = stream_to_change(state, promote.stream)
    require(promote.new_fence_epoch > stream.fence_epoch, Reason.STALE_EPOCH,
            f"epoch {promote.new_fence_epoch} is not above stream {stream.name!r}'s current "
            f"epoch {stream.fence_epoch}")
    require(promote.new_fence_epoch == stream.fence_epoch + 1, Reason.INVALID_ARGUMENT,
            f"a promote moves the epoch by one: expected {stream.fence_epoch + 1}, "
            f"got {promote.new_fence_epoch}")
    require_member(state, promote.new_primary)
    replicas = tuple(promote.replicas) or stream.replicas
    check_placement(state, replicas, promote.new_primary)
    check_start_seq(stream, promote.epoch_start_seq)
    override = stream.override
    if override is not None and override.pinned:
        require(override.claimant == promote.new_primary, Reason.STREAM_PINNED,
                f"stream {stream.name!r} is pinned to {override.claimant!r}")
        override.fence_epoch = promote.new_fence_epoch
    else:
        stream.override = None
    index_primary(state, stream.name, old=stream.primary, new=promote.new_primary)
    stream.primary = promote.new_primary
    stream.replicas = replicas
    start_epoch(stream, epoch=promote.new_fence_epoch, start_seq=promote.epoch_start_seq,
                now_ms=now_ms)
    return stream

# Authority overrides -----------------------------------------------------------------------------


def authority_set_override(state: MetaState, command: raft_pb2.RaftCommand
                           ) -> raft_pb2.RaftResult:
    request = command.authority_set_override
    stream = stream_to_change(state, request.stream)
    require_member(state, request.claimant)
    require(request.claimant in stream.replicas, Reason.INVALID_ARGUMENT,
            f"claimant {request.claimant!r} does not hold a replica of {stream.name!r}")
    require(request.fence_epoch > stream.fence_epoch, Reason.STALE_EPOCH,
            f"epoch {request.fence_epoch} is not above stream {stream.name!r}'s current "
            f"epoch {stream.fence_epoch}")
    current = stream.override
    if current is not None and current.pinned:
        require(current.claimant == request.claimant, Reason.STREAM_PINNED,
                f"stream {stream.name!r} is pinned to {current.claimant!r}")
    check_start_seq(stream, request.epoch_start_seq)
    stream.override = Override(claimant=request.claimant, fence_epoch=request.fence_epoch,
                               pinned=request.pinned, set_ms=command.now_ms)
    index_primary(state, stream.name, old=stream.primary, new=request.claimant)
    stream.primary = request.claimant
    start_epoch(stream, epoch=request.fence_epoch, start_seq=request.epoch_start_seq,
                now_ms=command.now_ms)
    return accepted(stream=stream)


def authority_clear_override(state: MetaState, command: raft_pb2.RaftCommand
                             ) -> raft_pb2.RaftResult:
    stream = stream_to_change(state, command.authority_clear_override.stream)
    if stream.override is None:
        return accepted(changed=False, stream=stream)
    require(not stream.override.pinned, Reason.STREAM_PINNED,
            f"stream {stream.name!r} is pinned to {stream.override.claimant!r}; unpin it first")
    stream.override = None
    stream.updated_ms = command.now_ms
    return accepted(stream=stream)


def authority_set_pinned(state: MetaState, command: raft_pb2.RaftCommand
                         ) -> raft_pb2.RaftResult:
    request = command.authority_set_pinned
    stream = stream_to_change(state, request.stream)
    override = stream.override
    if override is None:
        if not request.pinned:
            return accepted(changed=False, stream=stream)  # nothing pinned: unpinning is a no-op
        raise Rejected(Reason.INVALID_ARGUMENT,
                       f"stream {stream.name!r} has no authority override to pin")
    changed = override.pinned != request.pinned
    override.pinned = request.pinned
    return accepted(changed=changed, stream=stream)
