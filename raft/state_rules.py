"""What every handler of the metadata state machine shares: the rejection (`Rejected`, raised
inside a handler, turned into a `RaftResult` by `apply`), the result builders, the lookups of
what a command works on, and the checks and updates that more than one kind of command makes
(placement, epoch starts, the by-primary index).

Pure, like the rest of the state machine.
"""

from __future__ import annotations

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    ConsumerAssignment,
    Member,
    MetaState,
    StreamAssignment,
    epoch_history_max,
    replicas_max,
)


class Rejected(Exception):
    """Internal control flow of `apply`: never escapes it."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def rejected(reason: Reason, message: str) -> raft_pb2.RaftResult:
    return raft_pb2.RaftResult(ok=False, reason=reason.name, message=message)


def accepted(*, changed: bool = True, stream: StreamAssignment | None = None
             ) -> raft_pb2.RaftResult:
    result = raft_pb2.RaftResult(ok=True, changed=changed)
    if stream is not None:
        result.fence_epoch = stream.fence_epoch
        result.stream_id = stream.stream_id
    return result


def require(condition: bool, reason: Reason, message: str) -> None:
    if not condition:
        raise Rejected(reason, message)


def stream_to_change(state: MetaState, name: str) -> StreamAssignment:
    """The stream a handler works on (and may change: its encoded record is dropped)."""
    stream = state.streams.get(name)
    if stream is None:
        raise Rejected(Reason.STREAM_NOT_FOUND, f"stream {name!r} not found")
    state.encoded_streams.pop(name, None)
    return stream


def consumer_to_change(state: MetaState, stream: str, name: str) -> ConsumerAssignment | None:
    """The consumer a handler works on (and may change: its encoded record is dropped)."""
    consumer = state.consumers.get(stream, {}).get(name)
    if consumer is not None:
        state.encoded_consumers.pop((stream, name), None)
    return consumer


def require_member(state: MetaState, node_id: str) -> Member:
    member = state.members.get(node_id)
    if member is None:
        raise Rejected(Reason.NODE_NOT_FOUND, f"node {node_id!r} is not a member")
    return member


def check_name(name: str, *, what: str) -> None:
    try:
        subjects.validate_name(name, what=what)
    except RaftlogError as err:
        raise Rejected(err.reason, err.message) from None


def check_placement(state: MetaState, replicas: tuple[str, ...], primary: str) -> None:
    """Replicas: 1..replicas_max distinct members; the primary is one of them."""
    require(bool(replicas), Reason.INVALID_ARGUMENT, "a stream needs at least one replica")
    require(len(replicas) <= replicas_max, Reason.INVALID_ARGUMENT,
            f"a stream has at most {replicas_max} replicas")
    require(len(set(replicas)) == len(replicas), Reason.INVALID_ARGUMENT,
            f"replicas {list(replicas)} repeat a node")
    for node_id in replicas:
        require_member(state, node_id)
    require(primary in replicas, Reason.INVALID_ARGUMENT,
            f"primary {primary!r} is not one of the replicas {list(replicas)}")


def check_start_seq(stream: StreamAssignment, start_seq: int) -> None:
    require(start_seq >= 1, Reason.INVALID_ARGUMENT, "epoch_start_seq must be at least 1")
    require(start_seq >= stream.epoch_start_seq, Reason.INVALID_ARGUMENT,
            f"epoch_start_seq {start_seq} is below the current epoch's start "
            f"{stream.epoch_start_seq}: seqs never go back")


def index_primary(state: MetaState, name: str, *, old: str, new: str) -> None:
    if old:
        led = state.by_primary.get(old)
        if led is not None:
            led.discard(name)
            if not led:
                del state.by_primary[old]
    if new:
        state.by_primary.setdefault(new, set()).add(name)


def start_epoch(stream: StreamAssignment, *, epoch: int, start_seq: int, now_ms: int) -> None:
    stream.fence_epoch = epoch
    stream.epoch_start_seq = start_seq
    stream.updated_ms = now_ms
    stream.epoch_history.append((epoch, start_seq))
    del stream.epoch_history[:-epoch_history_max]
