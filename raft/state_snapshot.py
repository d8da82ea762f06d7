"""Snapshots of the metadata state: `to_snapshot` / `from_snapshot` (protobuf), and
`encode_snapshot`, the same bytes re-encoding only what changed since the last snapshot.
"""

from __future__ import annotations

from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    ConsumerAssignment,
    Member,
    MetaState,
    Override,
    StreamAssignment,
    check_invariants,
    invariant,
)
from raftlog.raft.state_rules import index_primary
from raftlog.v1 import consumers_pb2, types_pb2


def to_snapshot(state: MetaState) -> raft_pb2.RaftSnapshot:
    """The whole state as a protobuf, built from scratch; lists sorted by key, so equal states
    give equal bytes. `encode_snapshot` gives the same bytes faster."""
    snapshot = raft_pb2.RaftSnapshot(last_applied_index=state.applied_index,
                                     next_stream_id=state.next_stream_id)
    _add_members(snapshot, state)
    _add_users(snapshot, state)
    for name in sorted(state.streams):
        snapshot.streams.append(_stream_record(state.streams[name]))
    for stream_name in sorted(state.consumers):
        consumers = state.consumers[stream_name]
        for consumer_name in sorted(consumers):
            snapshot.consumers.append(_consumer_record(stream_name, consumers[consumer_name]))
    return snapshot


def encode_snapshot(state: MetaState, *, last_applied_index: int | None = None) -> bytes:
    """`to_snapshot(state).SerializeToString()`, re-encoding only the streams and consumers
    changed since the last call (a snapshot is taken in pysyncobj's tick thread, which must not
    stall for long). Protobuf lets repeated fields be concatenated, encoded, in key order."""
    head = raft_pb2.RaftSnapshot(
        last_applied_index=state.applied_index if last_applied_index is None
        else last_applied_index,
        next_stream_id=state.next_stream_id)
    _add_members(head, state)
    parts = [head.SerializeToString()]
    for name in sorted(state.streams):
        record = state.encoded_streams.get(name)
        if record is None:
            record = _stream_record(state.streams[name]).SerializeToString()
            state.encoded_streams[name] = record
        parts += (_STREAMS_TAG, _varint(len(record)), record)
    for stream_name in sorted(state.consumers):
        consumers = state.consumers[stream_name]
        for consumer_name in sorted(consumers):
            key = (stream_name, consumer_name)
            record = state.encoded_consumers.get(key)
            if record is None:
                record = _consumer_record(stream_name, consumers[consumer_name]
                                          ).SerializeToString()
                state.encoded_consumers[key] = record
            parts += (_CONSUMERS_TAG, _varint(len(record)), record)
    tail = raft_pb2.RaftSnapshot()
    _add_users(tail, state)  # field 6 follows the consumers (5), as to_snapshot orders them
    parts.append(tail.SerializeToString())
    return b"".join(parts)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_LENGTH_DELIMITED = 2
_STREAMS_TAG = _varint(raft_pb2.RaftSnapshot.STREAMS_FIELD_NUMBER << 3 | _LENGTH_DELIMITED)
_CONSUMERS_TAG = _varint(raft_pb2.RaftSnapshot.CONSUMERS_FIELD_NUMBER << 3 | _LENGTH_DELIMITED)


def _add_members(snapshot: raft_pb2.RaftSnapshot, state: MetaState) -> None:
    for node_id in sorted(state.members):
        member = state.members[node_id]
        snapshot.members.add(
            node_id=member.node_id, raft_address=member.raft_address,
            grpc_address=member.grpc_address, status=member.status,
            since_ms=member.since_ms, joined_ms=member.joined_ms,
            peer_address=member.peer_address,
        )


def _add_users(snapshot: raft_pb2.RaftSnapshot, state: MetaState) -> None:
    """Users are re-encoded every time: there are few, and they change rarely."""
    for name in sorted(state.users):
        snapshot.users.append(state.users[name])


def _stream_record(stream: StreamAssignment) -> raft_pb2.StreamAssignment:
    record = raft_pb2.StreamAssignment(
        name=stream.name, stream_id=stream.stream_id, config=stream.config,
        replicas=stream.replicas, primary=stream.primary, fence_epoch=stream.fence_epoch,
        epoch_start_seq=stream.epoch_start_seq, created_ms=stream.created_ms,
        updated_ms=stream.updated_ms,
        epoch_history=[raft_pb2.EpochStart(fence_epoch=epoch, start_seq=start_seq)
                       for epoch, start_seq in stream.epoch_history],
        owner=stream.owner,
    )
    if stream.override is not None:
        record.override.CopyFrom(raft_pb2.AuthorityOverride(
            claimant=stream.override.claimant, fence_epoch=stream.override.fence_epoch,
            pinned=stream.override.pinned, set_ms=stream.override.set_ms,
        ))
    return record


def _consumer_record(stream_name: str, consumer: ConsumerAssignment
                     ) -> raft_pb2.ConsumerAssignment:
    return raft_pb2.ConsumerAssignment(
        stream=stream_name, config=consumer.config, created_ms=consumer.created_ms,
        ack_floor=consumer.ack_floor, acked=sorted(consumer.acked),
        delivered_seq=consumer.delivered_seq,
    )


def from_snapshot(snapshot: raft_pb2.RaftSnapshot) -> MetaState:
    """The state a snapshot holds; raises InvariantViolation when it breaks a rule."""
    state = MetaState(next_stream_id=snapshot.next_stream_id,
                      applied_index=snapshot.last_applied_index)
    for member in snapshot.members:
        state.members[member.node_id] = Member(
            node_id=member.node_id, raft_address=member.raft_address,
            grpc_address=member.grpc_address, status=member.status, since_ms=member.since_ms,
            joined_ms=member.joined_ms, peer_address=member.peer_address,
        )
    for user in snapshot.users:
        kept = raft_pb2.UserRecord()
        kept.CopyFrom(user)
        state.users[user.name] = kept
    for record in snapshot.streams:
        state.streams[record.name] = _stream_from_record(record)
        state.consumers[record.name] = {}
        index_primary(state, record.name, old="", new=record.primary)
    for entry in snapshot.consumers:
        config = consumers_pb2.ConsumerConfig()
        config.CopyFrom(entry.config)
        invariant(entry.stream in state.consumers,
                  f"snapshot: consumer {config.name!r} of a missing stream {entry.stream!r}")
        state.consumers[entry.stream][config.name] = ConsumerAssignment(
            stream=entry.stream, config=config, created_ms=entry.created_ms,
            ack_floor=entry.ack_floor, acked=set(entry.acked), delivered_seq=entry.delivered_seq,
        )
    check_invariants(state)
    return state


def _stream_from_record(record: raft_pb2.StreamAssignment) -> StreamAssignment:
    config = types_pb2.StreamConfig()
    config.CopyFrom(record.config)
    override = None
    if record.HasField("override"):
        override = Override(claimant=record.override.claimant,
                            fence_epoch=record.override.fence_epoch,
                            pinned=record.override.pinned, set_ms=record.override.set_ms)
    return StreamAssignment(
        name=record.name, stream_id=record.stream_id, config=config,
        replicas=tuple(record.replicas), primary=record.primary,
        fence_epoch=record.fence_epoch, epoch_start_seq=record.epoch_start_seq,
        created_ms=record.created_ms, updated_ms=record.updated_ms, override=override,
        epoch_history=[(entry.fence_epoch, entry.start_seq) for entry in record.epoch_history],
        owner=record.owner,
    )
