"""Consumers in the metadata state machine: create, delete, progress (ack floors that never
go back, acked seqs above them, delivered seqs) merged from batches of updates, and an
operator's set of one consumer's progress (the handlers `apply` calls).
"""

from __future__ import annotations

from raftlog.base.errors import Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    ConsumerAssignment,
    MetaState,
    acked_above_floor_max,
    consumer_updates_max,
    consumers_per_stream_max,
)
from raftlog.raft.state_rules import (
    Rejected,
    accepted,
    check_name,
    consumer_to_change,
    require,
    stream_to_change,
)
from raftlog.v1 import consumers_pb2


def consumer_create(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    create = command.consumer_create
    stream = stream_to_change(state, create.stream)
    check_name(create.config.name, what="consumer")
    consumers = state.consumers.setdefault(stream.name, {})
    existing = consumers.get(create.config.name)
    if existing is not None:
        require(existing.config == create.config, Reason.CONSUMER_EXISTS,
                f"consumer {create.config.name!r} exists with another config")
        return accepted(changed=False, stream=stream)
    require(len(consumers) < consumers_per_stream_max, Reason.TOO_MANY_CONSUMERS,
            f"a stream has at most {consumers_per_stream_max} consumers")
    config = consumers_pb2.ConsumerConfig()
    config.CopyFrom(create.config)
    consumers[config.name] = ConsumerAssignment(stream=stream.name, config=config,
                                                created_ms=command.now_ms)
    state.encoded_consumers.pop((stream.name, config.name), None)
    return accepted(stream=stream)


def consumer_delete(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    request = command.consumer_delete
    stream = stream_to_change(state, request.stream)
    consumers = state.consumers.get(stream.name, {})
    require(request.consumer in consumers, Reason.CONSUMER_NOT_FOUND,
            f"consumer {request.consumer!r} of stream {stream.name!r} not found")
    del consumers[request.consumer]
    state.encoded_consumers.pop((stream.name, request.consumer), None)
    return accepted(stream=stream)


def _merge_progress(consumer: ConsumerAssignment, progress: raft_pb2.ConsumerProgress
                    ) -> tuple[int, set[int], bool] | None:
    """The consumer's new (floor, acked) and whether it changed; None when the acked set
    would exceed its limit."""
    floor = max(consumer.ack_floor, progress.ack_floor)
    acked = {seq for seq in consumer.acked if seq > floor}
    acked.update(seq for seq in progress.acked if seq > floor)
    while floor + 1 in acked:
        floor += 1
        acked.discard(floor)
    if len(acked) > acked_above_floor_max:
        return None
    changed = floor != consumer.ack_floor or acked != consumer.acked
    return floor, acked, changed


def consumer_state_update(state: MetaState, command: raft_pb2.RaftCommand
                          ) -> raft_pb2.RaftResult:
    updates = command.consumer_state_update.updates
    require(len(updates) <= consumer_updates_max, Reason.BATCH_TOO_LARGE,
            f"at most {consumer_updates_max} consumer updates per command")
    result = raft_pb2.RaftResult(ok=True)

    def skip(progress: raft_pb2.ConsumerProgress, reason: Reason) -> None:
        result.skipped.add(stream=progress.stream, consumer=progress.consumer, reason=reason.name)

    for progress in updates:
        stream = state.streams.get(progress.stream)
        if stream is None:
            skip(progress, Reason.STREAM_NOT_FOUND)
            continue
        if progress.fence_epoch and progress.fence_epoch < stream.fence_epoch:
            skip(progress, Reason.STALE_EPOCH)
            continue
        consumer = consumer_to_change(state, progress.stream, progress.consumer)
        if consumer is None:
            skip(progress, Reason.CONSUMER_NOT_FOUND)
            continue
        merged = _merge_progress(consumer, progress)
        if merged is None:
            skip(progress, Reason.OVERLOADED)
            continue
        floor, acked, changed = merged
        consumer.ack_floor, consumer.acked = floor, acked
        if progress.delivered_seq > consumer.delivered_seq:
            consumer.delivered_seq = progress.delivered_seq
            changed = True
        result.changed = result.changed or changed
        result.updates_applied += 1
    return result


def consumer_state_set(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    """Replaces one consumer's progress (an audit's repair): the only way a floor goes down.
    Every check comes before the change: a rejected set changes nothing."""
    request = command.consumer_state_set
    stream = state.streams.get(request.stream)
    if stream is None:
        raise Rejected(Reason.STREAM_NOT_FOUND, f"stream {request.stream!r} not found")
    require(not request.fence_epoch or request.fence_epoch >= stream.fence_epoch,
            Reason.STALE_EPOCH, f"the set was proposed at fence epoch {request.fence_epoch}; "
            f"{stream.name!r} is at {stream.fence_epoch} (its primary changed)")
    current = state.consumers.get(stream.name, {}).get(request.consumer)
    if current is None:
        raise Rejected(Reason.CONSUMER_NOT_FOUND, f"consumer {request.consumer!r} of stream "
                       f"{stream.name!r} not found")
    floor, acked = _set_progress(request)
    if request.HasField("expect"):
        expect = request.expect
        seen = (expect.delivered_seq, expect.ack_floor, expect.acked_count)
        now = (current.delivered_seq, current.ack_floor, len(current.acked))
        require(seen == now, Reason.CONSUMER_CHANGED,
                f"consumer {request.consumer!r} of {stream.name!r} is at delivered seq {now[0]}, "
                f"ack floor {now[1]} with {now[2]} acked above it; the repair expected "
                f"{seen[0]}, {seen[1]}, {seen[2]}: audit again")
    changed = (floor, acked, request.delivered_seq) != (current.ack_floor, current.acked,
                                                        current.delivered_seq)
    consumer_to_change(state, stream.name, request.consumer)  # drops its encoded record
    current.ack_floor, current.acked = floor, acked
    current.delivered_seq = request.delivered_seq
    return accepted(changed=changed, stream=stream)


def _set_progress(request: raft_pb2.ConsumerStateSet) -> tuple[int, set[int]]:
    """The (floor, acked) a set leaves, normalised as a merge would; rejects values past the
    committed end the command names, and an acked set over its limit."""
    end = request.commit_seq
    past = [name for name, value in (("ack floor", request.ack_floor),
                                     ("delivered seq", request.delivered_seq),
                                     ("acked seq", max(request.acked, default=0)))
            if value > end]
    require(not past, Reason.PAST_COMMITTED_END,
            f"{', '.join(past)} past the committed end {end} of stream {request.stream!r}")
    floor = request.ack_floor
    acked = {seq for seq in request.acked if seq > floor}
    while floor + 1 in acked:
        floor += 1
        acked.discard(floor)
    require(len(acked) <= acked_above_floor_max, Reason.INVALID_ARGUMENT,
            f"at most {acked_above_floor_max} acked seqs above the floor")
    return floor, acked
