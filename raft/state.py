"""The metadata state machine: every rule that changes the cluster's metadata, in one place.

Owns `MetaState` (members, stream assignments with fence epochs and authority overrides,
consumer progress), `apply(state, command) -> RaftResult`, `check_invariants`, and the
snapshot codec `to_snapshot` / `from_snapshot`.

`apply` is pure and deterministic: no disk, network, clock, randomness or logging; time comes
in the command (`now_ms`). It mutates `state` in place and only after every check passed, so a
rejected command leaves the state untouched. A rejection is a normal `RaftResult` (ok=False,
reason = a `Reason` name), never an exception: every member applies the same commands in the
same order and must reach the same state, including the same rejections.

Rules (tests/test_raft_state.py has a test named after each):
- stream names are unique; a stream's id is assigned here and never reused;
- fence epochs only grow: an override or promote at an epoch <= the current one is STALE_EPOCH;
- one authority per stream: the primary; an override names the primary, never a second one;
- a stream's primary and replicas are members, the primary is one of the replicas;
- a member joins once (NODE_EXISTS); leaving an unknown node is NODE_NOT_FOUND; the last member
  cannot leave (LAST_MEMBER); a member that still holds a stream cannot leave;
- consumers belong to existing streams (STREAM_NOT_FOUND);
- ack floors never go back: a lower floor is ignored, its acked seqs are still merged;
- deleting a stream deletes its consumers and its override;
- a pinned override stays: promote moves authority only to its claimant, clearing is refused
  (STREAM_PINNED); pinning needs an override, unpinning a stream without one changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from raftlog.base import limits, subjects
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.v1 import consumers_pb2, types_pb2

# Limits of the metadata (units last).
members_max = 1_024
node_id_bytes_max = 128
address_bytes_max = 256
epoch_history_max = 64  # (epoch, start seq) pairs kept per stream, newest last
consumer_updates_max = 10_000  # ConsumerProgress entries in one ConsumerStateUpdate
promotes_max = 1_000  # StreamPromote entries in one StreamPromotes
acked_above_floor_max = limits.acked_above_floor_max


ALIVE = raft_pb2.MEMBER_STATUS_ALIVE


@dataclass
class Member:
    node_id: str
    raft_address: str
    grpc_address: str
    status: raft_pb2.MemberStatus.ValueType
    since_ms: int
    joined_ms: int
    peer_address: str = ""  # the peer listener; "" for a member that registered without one


@dataclass
class Override:
    """An operator-chosen authority. Invariant: `claimant` is the stream's primary."""

    claimant: str
    fence_epoch: int
    pinned: bool
    set_ms: int


@dataclass
class StreamAssignment:
    name: str
    stream_id: int
    config: types_pb2.StreamConfig
    replicas: tuple[str, ...]  # the primary included
    primary: str  # the stream's one authority at `fence_epoch`
    fence_epoch: int
    epoch_start_seq: int
    created_ms: int
    updated_ms: int
    override: Override | None = None
    epoch_history: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start seq)


@dataclass
class ConsumerAssignment:
    stream: str
    config: consumers_pb2.ConsumerConfig
    created_ms: int
    ack_floor: int = 0
    acked: set[int] = field(default_factory=set)  # all > ack_floor
    delivered_seq: int = 0

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class MetaState:
    members: dict[str, Member] = field(default_factory=dict)
    streams: dict[str, StreamAssignment] = field(default_factory=dict)
    consumers: dict[str, dict[str, ConsumerAssignment]] = field(default_factory=dict)
    next_stream_id: int = 1
    # Raft index of the last applied command; maintained by the group, not by `apply`.
    applied_index: int = 0
    # Snapshot records already encoded, kept between snapshots so a snapshot re-encodes only
    # what changed; `apply` drops the entry of every stream or consumer it may change. Not
    # part of the state's value.
    encoded_streams: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    encoded_consumers: dict[tuple[str, str], bytes] = field(default_factory=dict, repr=False,
                                                            compare=False)
    # Derived index: stream names by primary, kept by `apply` (and rebuilt from a snapshot),
    # so per-node work (a lost node's streams) does not scan every stream. Not part of the
    # state's value.
    by_primary: dict[str, set[str]] = field(default_factory=dict, repr=False, compare=False)

    def streams_led_by(self, node_id: str) -> list[str]:
        return sorted(self.by_primary.get(node_id, ()))

    def streams_held_by(self, node_id: str) -> list[str]:
        """Names of the streams whose primary or replicas include the node."""
        return sorted(
            name for name, stream in self.streams.items()
            if node_id == stream.primary or node_id in stream.replicas
        )


class _Rejected(Exception):
    """Internal control flow of `apply`: never escapes it."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def rejected(reason: Reason, message: str) -> raft_pb2.RaftResult:
    return raft_pb2.RaftResult(ok=False, reason=reason.name, message=message)


def _ok(*, changed: bool = True, stream: StreamAssignment | None = None) -> raft_pb2.RaftResult:
    result = raft_pb2.RaftResult(ok=True, changed=changed)
    if stream is not None:
        result.fence_epoch = stream.fence_epoch
        result.stream_id = stream.stream_id
    return result


# ---------------------------------------------------------------------------------------------
# apply


def apply(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    """Applies one command; returns its result. Deterministic; never raises for any input."""
    kind = command.WhichOneof("command")
    handler = _HANDLERS.get(kind or "")
    if handler is None:
        return rejected(Reason.INVALID_ARGUMENT, f"unknown or empty command {kind!r}")
    try:
        return handler(state, command)
    except _Rejected as rejection:
        return rejected(rejection.reason, rejection.message)


def _require(condition: bool, reason: Reason, message: str) -> None:
    if not condition:
        raise _Rejected(reason, message)


def _stream(state: MetaState, name: str) -> StreamAssignment:
    """The stream a handler works on (and may change: its encoded record is dropped)."""
    stream = state.streams.get(name)
    if stream is None:
        raise _Rejected(Reason.STREAM_NOT_FOUND, f"stream {name!r} not found")
    state.encoded_streams.pop(name, None)
    return stream


def _consumer(state: MetaState, stream: str, name: str) -> ConsumerAssignment | None:
    """The consumer a handler works on (and may change: its encoded record is dropped)."""
    consumer = state.consumers.get(stream, {}).get(name)
    if consumer is not None:
        state.encoded_consumers.pop((stream, name), None)
    return consumer


def _member(state: MetaState, node_id: str) -> Member:
    member = state.members.get(node_id)
    if member is None:
        raise _Rejected(Reason.NODE_NOT_FOUND, f"node {node_id!r} is not a member")
    return member


def _valid_name(name: str, *, what: str) -> None:
    try:
        subjects.validate_name(name, what=what)
    except RaftlogError as err:
        raise _Rejected(err.reason, err.message) from None


def _check_placement(state: MetaState, replicas: tuple[str, ...], primary: str) -> None:
    """Replicas: 1..replicas_max distinct members; the primary is one of them."""
    _require(bool(replicas), Reason.INVALID_ARGUMENT, "a stream needs at least one replica")
    _require(len(replicas) <= limits.replicas_max, Reason.INVALID_ARGUMENT,
             f"a stream has at most {limits.replicas_max} replicas")
    _require(len(set(replicas)) == len(replicas), Reason.INVALID_ARGUMENT,
             f"replicas {list(replicas)} repeat a node")
    for node_id in replicas:
        _member(state, node_id)
    _require(primary in replicas, Reason.INVALID_ARGUMENT,
             f"primary {primary!r} is not one of the replicas {list(replicas)}")


def _check_start_seq(stream: StreamAssignment, start_seq: int) -> None:
    _require(start_seq >= 1, Reason.INVALID_ARGUMENT, "epoch_start_seq must be at least 1")
    _require(start_seq >= stream.epoch_start_seq, Reason.INVALID_ARGUMENT,
             f"epoch_start_seq {start_seq} is below the current epoch's start "
             f"{stream.epoch_start_seq}: seqs never go back")


def _index_primary(state: MetaState, name: str, *, old: str, new: str) -> None:
    if old:
        led = state.by_primary.get(old)
        if led is not None:
            led.discard(name)
            if not led:
                del state.by_primary[old]
    if new:
        state.by_primary.setdefault(new, set()).add(name)


def _start_epoch(stream: StreamAssignment, *, epoch: int, start_seq: int, now_ms: int) -> None:
    stream.fence_epoch = epoch
    stream.epoch_start_seq = start_seq
    stream.updated_ms = now_ms
    stream.epoch_history.append((epoch, start_seq))
    del stream.epoch_history[:-epoch_history_max]


# Members ---------------------------------------------------------------------------------------


def _member_join(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    join = command.member_join
    _require(0 < len(join.node_id.encode()) <= node_id_bytes_max, Reason.INVALID_ARGUMENT,
             f"node_id must be 1..{node_id_bytes_max} bytes")
    for what, address in (("raft_address", join.raft_address),
                          ("grpc_address", join.grpc_address)):
        _require(0 < len(address.encode()) <= address_bytes_max, Reason.INVALID_ARGUMENT,
                 f"{what} must be 1..{address_bytes_max} bytes")
    _require(len(join.peer_address.encode()) <= address_bytes_max, Reason.INVALID_ARGUMENT,
             f"peer_address must be at most {address_bytes_max} bytes")
    _require(join.node_id not in state.members, Reason.NODE_EXISTS,
             f"node {join.node_id!r} is already a member")
    for other in state.members.values():
        _require(join.raft_address != other.raft_address, Reason.NODE_EXISTS,
                 f"raft address {join.raft_address} belongs to {other.node_id!r}")
        _require(join.grpc_address != other.grpc_address, Reason.NODE_EXISTS,
                 f"grpc address {join.grpc_address} belongs to {other.node_id!r}")
        _require(not join.peer_address or join.peer_address != other.peer_address,
                 Reason.NODE_EXISTS,
                 f"peer address {join.peer_address} belongs to {other.node_id!r}")
    _require(len(state.members) < members_max, Reason.INVALID_ARGUMENT,
             f"a cluster has at most {members_max} members")
    state.members[join.node_id] = Member(
        node_id=join.node_id, raft_address=join.raft_address, grpc_address=join.grpc_address,
        status=ALIVE, since_ms=command.now_ms, joined_ms=command.now_ms,
        peer_address=join.peer_address,
    )
    return _ok()


def _member_leave(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    node_id = command.member_leave.node_id
    _member(state, node_id)
    _require(len(state.members) > 1, Reason.LAST_MEMBER,
             f"node {node_id!r} is the last member")
    held = state.streams_held_by(node_id)
    _require(not held, Reason.NODE_IN_USE,
             f"node {node_id!r} still holds {len(held)} streams (e.g. {held[:3]}); move them first")
    del state.members[node_id]
    return _ok()


def _member_set_status(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    update = command.member_set_status
    member = _member(state, update.node_id)
    _require(update.status in (raft_pb2.MEMBER_STATUS_ALIVE, raft_pb2.MEMBER_STATUS_SUSPECT,
                               raft_pb2.MEMBER_STATUS_DEAD),
             Reason.INVALID_ARGUMENT, f"unknown member status {update.status}")
    if member.status == update.status:
        return _ok(changed=False)  # keeps the earlier `since_ms`
    member.status = update.status
    member.since_ms = update.since_ms or command.now_ms
    return _ok()


# Streams ---------------------------------------------------------------------------------------


def _stream_create(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    create = command.stream_create
    name = create.config.name
    _valid_name(name, what="stream")
    _require(name not in state.streams, Reason.STREAM_EXISTS, f"stream {name!r} already exists")
    _require(len(state.streams) < limits.streams_max, Reason.TOO_MANY_STREAMS,
             f"the cluster holds at most {limits.streams_max} streams")
    replicas = tuple(create.replicas)
    _check_placement(state, replicas, create.primary)
    epoch = create.fence_epoch or 1
    start_seq = create.epoch_start_seq or 1
    config = types_pb2.StreamConfig()
    config.CopyFrom(create.config)
    stream = StreamAssignment(
        name=name, stream_id=state.next_stream_id, config=config, replicas=replicas,
        primary=create.primary, fence_epoch=epoch, epoch_start_seq=start_seq,
        created_ms=command.now_ms, updated_ms=command.now_ms, epoch_history=[(epoch, start_seq)],
    )
    state.next_stream_id += 1
    state.streams[name] = stream
    _index_primary(state, name, old="", new=stream.primary)
    state.consumers[name] = {}
    state.encoded_streams.pop(name, None)
    return _ok(stream=stream)


def _stream_update(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    update = command.stream_update
    stream = _stream(state, update.name)
    if update.HasField("config"):
        _require(update.config.name == update.name, Reason.IMMUTABLE_FIELD,
                 f"a stream cannot be renamed ({update.name!r} -> {update.config.name!r})")
    replicas = tuple(update.replicas) or stream.replicas
    _check_placement(state, replicas, stream.primary)
    changed = replicas != stream.replicas
    if update.HasField("config") and update.config != stream.config:
        stream.config = types_pb2.StreamConfig()
        stream.config.CopyFrom(update.config)
        changed = True
    stream.replicas = replicas
    if changed:
        stream.updated_ms = command.now_ms
    return _ok(changed=changed, stream=stream)


def _stream_delete(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    stream = _stream(state, command.stream_delete.name)
    del state.streams[stream.name]  # the override lives in the assignment
    _index_primary(state, stream.name, old=stream.primary, new="")
    for consumer_name in state.consumers.pop(stream.name, {}):
        state.encoded_consumers.pop((stream.name, consumer_name), None)
    return _ok(stream=stream)


def _stream_promote(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    return _ok(stream=_promote(state, command.stream_promote, now_ms=command.now_ms))


def _stream_promotes(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    promotes = command.stream_promotes.promotes
    _require(len(promotes) <= promotes_max, Reason.BATCH_TOO_LARGE,
             f"at most {promotes_max} promotes per command")
    result = raft_pb2.RaftResult(ok=True)
    for promote in promotes:
        try:
            _promote(state, promote, now_ms=command.now_ms)
        except _Rejected as rejection:
            result.skipped.add(stream=promote.stream, reason=rejection.reason.name)
            continue
        result.updates_applied += 1
        result.changed = True
    return result


def _promote(state: MetaState, promote: raft_pb2.StreamPromote, *, now_ms: int
             ) -> StreamAssignment:
    """One failover; raises _Rejected (changing nothing) when a rule forbids it."""
    stream = _stream(state, promote.stream)
    _require(promote.new_fence_epoch > stream.fence_epoch, Reason.STALE_EPOCH,
             f"epoch {promote.new_fence_epoch} is not above stream {stream.name!r}'s current "
             f"epoch {stream.fence_epoch}")
    _require(promote.new_fence_epoch == stream.fence_epoch + 1, Reason.INVALID_ARGUMENT,
             f"a promote moves the epoch by one: expected {stream.fence_epoch + 1}, "
             f"got {promote.new_fence_epoch}")
    _member(state, promote.new_primary)
    replicas = tuple(promote.replicas) or stream.replicas
    _check_placement(state, replicas, promote.new_primary)
    _check_start_seq(stream, promote.epoch_start_seq)
    override = stream.override
    if override is not None and override.pinned:
        _require(override.claimant == promote.new_primary, Reason.STREAM_PINNED,
                 f"stream {stream.name!r} is pinned to {override.claimant!r}")
        override.fence_epoch = promote.new_fence_epoch
    else:
        stream.override = None
    _index_primary(state, stream.name, old=stream.primary, new=promote.new_primary)
    stream.primary = promote.new_primary
    stream.replicas = replicas
    _start_epoch(stream, epoch=promote.new_fence_epoch, start_seq=promote.epoch_start_seq,
                 now_ms=now_ms)
    return stream


# Authority overrides -----------------------------------------------------------------------------


def _authority_set_override(state: MetaState, command: raft_pb2.RaftCommand
                            ) -> raft_pb2.RaftResult:
    request = command.authority_set_override
    stream = _stream(state, request.stream)
    _member(state, request.claimant)
    _require(request.claimant in stream.replicas, Reason.INVALID_ARGUMENT,
             f"claimant {request.claimant!r} does not hold a replica of {stream.name!r}")
    _require(request.fence_epoch > stream.fence_epoch, Reason.STALE_EPOCH,
             f"epoch {request.fence_epoch} is not above stream {stream.name!r}'s current "
             f"epoch {stream.fence_epoch}")
    current = stream.override
    if current is not None and current.pinned:
        _require(current.claimant == request.claimant, Reason.STREAM_PINNED,
                 f"stream {stream.name!r} is pinned to {current.claimant!r}")
    _check_start_seq(stream, request.epoch_start_seq)
    stream.override = Override(claimant=request.claimant, fence_epoch=request.fence_epoch,
                               pinned=request.pinned, set_ms=command.now_ms)
    _index_primary(state, stream.name, old=stream.primary, new=request.claimant)
    stream.primary = request.claimant
    _start_epoch(stream, epoch=request.fence_epoch, start_seq=request.epoch_start_seq,
                 now_ms=command.now_ms)
    return _ok(stream=stream)


def _authority_clear_override(state: MetaState, command: raft_pb2.RaftCommand
                              ) -> raft_pb2.RaftResult:
    stream = _stream(state, command.authority_clear_override.stream)
    if stream.override is None:
        return _ok(changed=False, stream=stream)
    _require(not stream.override.pinned, Reason.STREAM_PINNED,
             f"stream {stream.name!r} is pinned to {stream.override.claimant!r}; unpin it first")
    stream.override = None
    stream.updated_ms = command.now_ms
    return _ok(stream=stream)


def _authority_set_pinned(state: MetaState, command: raft_pb2.RaftCommand
                          ) -> raft_pb2.RaftResult:
    request = command.authority_set_pinned
    stream = _stream(state, request.stream)
    override = stream.override
    if override is None:
        if not request.pinned:
            return _ok(changed=False, stream=stream)  # nothing pinned: unpinning is a no-op
        raise _Rejected(Reason.INVALID_ARGUMENT,
                        f"stream {stream.name!r} has no authority override to pin")
    changed = override.pinned != request.pinned
    override.pinned = request.pinned
    return _ok(changed=changed, stream=stream)


# Consumers ---------------------------------------------------------------------------------------


def _consumer_create(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    create = command.consumer_create
    stream = _stream(state, create.stream)
    _valid_name(create.config.name, what="consumer")
    consumers = state.consumers.setdefault(stream.name, {})
    existing = consumers.get(create.config.name)
    if existing is not None:
        _require(existing.config == create.config, Reason.CONSUMER_EXISTS,
                 f"consumer {create.config.name!r} exists with another config")
        return _ok(changed=False, stream=stream)
    _require(len(consumers) < limits.consumers_per_stream_max, Reason.TOO_MANY_CONSUMERS,
             f"a stream has at most {limits.consumers_per_stream_max} consumers")
    config = consumers_pb2.ConsumerConfig()
    config.CopyFrom(create.config)
    consumers[config.name] = ConsumerAssignment(stream=stream.name, config=config,
                                                created_ms=command.now_ms)
    state.encoded_consumers.pop((stream.name, config.name), None)
    return _ok(stream=stream)


def _consumer_delete(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    request = command.consumer_delete
    stream = _stream(state, request.stream)
    consumers = state.consumers.get(stream.name, {})
    _require(request.consumer in consumers, Reason.CONSUMER_NOT_FOUND,
             f"consumer {request.consumer!r} of stream {stream.name!r} not found")
    del consumers[request.consumer]
    state.encoded_consumers.pop((stream.name, request.consumer), None)
    return _ok(stream=stream)


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


def _consumer_state_update(state: MetaState, command: raft_pb2.RaftCommand
                           ) -> raft_pb2.RaftResult:
    updates = command.consumer_state_update.updates
    _require(len(updates) <= consumer_updates_max, Reason.BATCH_TOO_LARGE,
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
        consumer = _consumer(state, progress.stream, progress.consumer)
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


def _barrier(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    return _ok(changed=False)


_HANDLERS: dict[str, Callable[[MetaState, raft_pb2.RaftCommand], raft_pb2.RaftResult]] = {
    "member_join": _member_join,
    "member_leave": _member_leave,
    "member_set_status": _member_set_status,
    "stream_create": _stream_create,
    "stream_update": _stream_update,
    "stream_delete": _stream_delete,
    "authority_set_override": _authority_set_override,
    "authority_clear_override": _authority_clear_override,
    "authority_set_pinned": _authority_set_pinned,
    "stream_promote": _stream_promote,
    "stream_promotes": _stream_promotes,
    "consumer_create": _consumer_create,
    "consumer_delete": _consumer_delete,
    "consumer_state_update": _consumer_state_update,
    "barrier": _barrier,
}


# ---------------------------------------------------------------------------------------------
# Invariants


def check_invariants(state: MetaState) -> None:
    """Raises InvariantViolation when the state breaks a rule `apply` keeps. For tests and for
    a state loaded from a snapshot."""
    for node_id, member in state.members.items():
        _invariant(node_id == member.node_id, f"member key {node_id!r} != {member.node_id!r}")
    indexed = {(primary, name) for primary, names in state.by_primary.items() for name in names}
    _invariant(indexed == {(s.primary, s.name) for s in state.streams.values()},
               "the by-primary index does not match the streams' primaries")
    seen_ids: set[int] = set()
    for name, stream in state.streams.items():
        _check_stream_invariants(state, name, stream)
        _invariant(stream.stream_id not in seen_ids, f"stream id {stream.stream_id} reused")
        seen_ids.add(stream.stream_id)
    for name, consumers in state.consumers.items():
        _invariant(name in state.streams, f"consumers of a missing stream {name!r}")
        for consumer_name, consumer in consumers.items():
            _invariant(consumer_name == consumer.name and consumer.stream == name,
                       f"consumer key {name}/{consumer_name} != {consumer.stream}/{consumer.name}")
            _invariant(not consumer.acked or min(consumer.acked) > consumer.ack_floor,
                       f"consumer {name}/{consumer_name}: acked seq at or below the floor")
            _invariant(consumer.ack_floor + 1 not in consumer.acked,
                       f"consumer {name}/{consumer_name}: floor not advanced over acked seqs")


def _check_stream_invariants(state: MetaState, name: str, stream: StreamAssignment) -> None:
    _invariant(name == stream.name == stream.config.name, f"stream key {name!r} mismatch")
    _invariant(0 < stream.stream_id < state.next_stream_id, f"stream {name!r}: id out of range")
    _invariant(stream.primary in stream.replicas, f"stream {name!r}: primary not a replica")
    _invariant(len(set(stream.replicas)) == len(stream.replicas), f"stream {name!r}: dup replica")
    for node_id in stream.replicas:
        _invariant(node_id in state.members, f"stream {name!r}: replica {node_id!r} not a member")
    _invariant(stream.fence_epoch >= 1, f"stream {name!r}: epoch below 1")
    if stream.override is not None:
        _invariant(stream.override.claimant == stream.primary,
                   f"stream {name!r}: override claimant is not the primary (two authorities)")
        _invariant(stream.override.fence_epoch <= stream.fence_epoch,
                   f"stream {name!r}: override epoch above the stream's")
    epochs = [epoch for epoch, _ in stream.epoch_history]
    _invariant(epochs == sorted(set(epochs)), f"stream {name!r}: epoch history not increasing")
    _invariant(bool(epochs) and epochs[-1] == stream.fence_epoch,
               f"stream {name!r}: epoch history does not end at the current epoch")


def _invariant(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


# ---------------------------------------------------------------------------------------------
# Snapshot


def to_snapshot(state: MetaState) -> raft_pb2.RaftSnapshot:
    """The whole state as a protobuf, built from scratch; lists sorted by key, so equal states
    give equal bytes. `encode_snapshot` gives the same bytes faster."""
    snapshot = raft_pb2.RaftSnapshot(last_applied_index=state.applied_index,
                                     next_stream_id=state.next_stream_id)
    _add_members(snapshot, state)
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


def _stream_record(stream: StreamAssignment) -> raft_pb2.StreamAssignment:
    record = raft_pb2.StreamAssignment(
        name=stream.name, stream_id=stream.stream_id, config=stream.config,
        replicas=stream.replicas, primary=stream.primary, fence_epoch=stream.fence_epoch,
        epoch_start_seq=stream.epoch_start_seq, created_ms=stream.created_ms,
        updated_ms=stream.updated_ms,
        epoch_history=[raft_pb2.EpochStart(fence_epoch=epoch, start_seq=start_seq)
                       for epoch, start_seq in stream.epoch_history],
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
    for record in snapshot.streams:
        state.streams[record.name] = _stream_from_record(record)
        state.consumers[record.name] = {}
        _index_primary(state, record.name, old="", new=record.primary)
    for entry in snapshot.consumers:
        config = consumers_pb2.ConsumerConfig()
        config.CopyFrom(entry.config)
        _invariant(entry.stream in state.consumers,
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
    )
