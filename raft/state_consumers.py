"""Consumers in the metadata state machine: create, delete, and progress (ack floors that
never go back, acked seqs above them, delivered seqs) merged from batches of updates (the
handlers `apply` calls).
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
