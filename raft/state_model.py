"""The value of the metadata state machine: `MetaState` (members, stream assignments with
fence epochs and authority overrides, consumer progress), the limits of the metadata, and
`check_invariants`, the rules every state `apply` produces must keep.

No rule that changes the state lives here: those are in `state` and its handler modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raftlog.base.errors import InvariantViolation
from raftlog.internal import raft_pb2
from raftlog.v1 import consumers_pb2, types_pb2

# Limits of the metadata (units last).
members_max = 1_024
node_id_bytes_max = 128
address_bytes_max = 256
epoch_history_max = 64  # (epoch, start seq) pairs kept per stream, newest last
consumer_updates_max = 10_000  # ConsumerProgress entries in one ConsumerStateUpdate
promotes_max = 1_000  # StreamPromote entries in one StreamPromotes
# Caps `apply` enforces on what clients asked for. They belong to the state machine, not to a
# node's settings: two members with different values would apply one command differently, so a
# change is a change of the replicated protocol (every member runs the new code first). The
# node checks the same values earlier, with the names in base/limits.py (tests/unit/
# test_raft_state.py holds the two equal). The one cap of the cluster as a whole has no such
# twin: base/limits.py streams_per_node_max bounds the streams one node holds a copy of.
cluster_streams_max = 10_000  # streams in the cluster
replicas_max = 5  # replicas of one stream
consumers_per_stream_max = 1_000
acked_above_floor_max = 100_000  # acknowledged seqs above a consumer's ack floor
users_max = 1_000  # users of the cluster (raft/state_users.py)
tokens_per_user_max = 8  # tokens one user holds at once (a rotation adds one)
user_patterns_max = 64  # subject patterns in one user's rules, all lists together


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
    owner: str = ""  # the user whose call created it ("" = none): its max_bytes_stored counts it


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
    # Users by name (raft/state_users.py); while empty, client calls need no credential.
    users: dict[str, raft_pb2.UserRecord] = field(default_factory=dict)
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


def check_invariants(state: MetaState) -> None:
    """Raises InvariantViolation when the state breaks a rule `apply` keeps. For tests and for
    a state loaded from a snapshot."""
    for node_id, member in state.members.items():
        invariant(node_id == member.node_id, f"member key {node_id!r} != {member.node_id!r}")
    indexed = {(primary, name) for primary, names in state.by_primary.items() for name in names}
    invariant(indexed == {(s.primary, s.name) for s in state.streams.values()},
              "the by-primary index does not match the streams' primaries")
    _check_user_invariants(state)
    seen_ids: set[int] = set()
    for name, stream in state.streams.items():
        _check_stream_invariants(state, name, stream)
        invariant(stream.stream_id not in seen_ids, f"stream id {stream.stream_id} reused")
        seen_ids.add(stream.stream_id)
    for name, consumers in state.consumers.items():
        invariant(name in state.streams, f"consumers of a missing stream {name!r}")
        for consumer_name, consumer in consumers.items():
            invariant(consumer_name == consumer.name and consumer.stream == name,
                      f"consumer key {name}/{consumer_name} != {consumer.stream}/{consumer.name}")
            invariant(not consumer.acked or min(consumer.acked) > consumer.ack_floor,
                      f"consumer {name}/{consumer_name}: acked seq at or below the floor")
            invariant(consumer.ack_floor + 1 not in consumer.acked,
                      f"consumer {name}/{consumer_name}: floor not advanced over acked seqs")


def _check_user_invariants(state: MetaState) -> None:
    hashes: set[str] = set()
    for name, user in state.users.items():
        invariant(name == user.name, f"user key {name!r} != {user.name!r}")
        for token in user.tokens:
            invariant(token.sha256 not in hashes, f"user {name!r}: a token hash is reused")
            hashes.add(token.sha256)


def _check_stream_invariants(state: MetaState, name: str, stream: StreamAssignment) -> None:
    invariant(name == stream.name == stream.config.name, f"stream key {name!r} mismatch")
    invariant(0 < stream.stream_id < state.next_stream_id, f"stream {name!r}: id out of range")
    invariant(stream.primary in stream.replicas, f"stream {name!r}: primary not a replica")
    invariant(len(set(stream.replicas)) == len(stream.replicas), f"stream {name!r}: dup replica")
    for node_id in stream.replicas:
        invariant(node_id in state.members, f"stream {name!r}: replica {node_id!r} not a member")
    invariant(stream.fence_epoch >= 1, f"stream {name!r}: epoch below 1")
    if stream.override is not None:
        invariant(stream.override.claimant == stream.primary,
                  f"stream {name!r}: override claimant is not the primary (two authorities)")
        invariant(stream.override.fence_epoch <= stream.fence_epoch,
                  f"stream {name!r}: override epoch above the stream's")
    epochs = [epoch for epoch, _ in stream.epoch_history]
    invariant(epochs == sorted(set(epochs)), f"stream {name!r}: epoch history not increasing")
    invariant(bool(epochs) and epochs[-1] == stream.fence_epoch,
              f"stream {name!r}: epoch history does not end at the current epoch")


def invariant(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)
