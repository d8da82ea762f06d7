"""The metadata state machine: `apply`, the one way into every rule that changes the
cluster's metadata.

Owns `apply(state, command) -> RaftResult`: it dispatches each kind of command to its handler,
one module per concept: `state_members`, `state_streams` (streams, placement, promotes,
authority overrides), `state_consumers`, `state_users` (users and their tokens);
`state_rules` holds what the handlers share.
`state_model` holds `MetaState` and `check_invariants`; `state_snapshot` the snapshot codec.

`apply` is pure and deterministic: no disk, network, clock, randomness or logging; time comes
in the command (`now_ms`). It mutates `state` in place and only after every check passed, so a
rejected command leaves the state untouched. A rejection is a normal `RaftResult` (ok=False,
reason = a `Reason` name), never an exception: every member applies the same commands in the
same order and must reach the same state, including the same rejections.

Rules (tests/unit/test_raft_state.py has a test named after each):
- stream names are unique; a stream's id is assigned here and never reused;
- fence epochs only grow: an override or promote at an epoch <= the current one is STALE_EPOCH;
- one authority per stream: the primary; an override names the primary, never a second one;
- a stream's primary and replicas are members, the primary is one of the replicas;
- a member joins once (NODE_EXISTS); leaving an unknown node is NODE_NOT_FOUND; the last member
  cannot leave (LAST_MEMBER); a member that still holds a stream cannot leave;
- consumers belong to existing streams (STREAM_NOT_FOUND);
- ack floors never go back: a lower floor is ignored, its acked seqs are still merged;
- an operator's set of one consumer's progress (ConsumerStateSet) replaces it, floor included,
  but never past the committed end the proposing primary names (PAST_COMMITTED_END), never
  from a replaced primary (STALE_EPOCH), and with an expected state only while the consumer
  still has it (CONSUMER_CHANGED);
- deleting a stream deletes its consumers and its override;
- a pinned override stays: promote moves authority only to its claimant, clearing is refused
  (STREAM_PINNED); pinning needs an override, unpinning a stream without one changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.base.errors import Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_consumers import (
    consumer_create,
    consumer_delete,
    consumer_state_set,
    consumer_state_update,
)
from raftlog.raft.state_members import member_join, member_leave, member_set_status
from raftlog.raft.state_model import MetaState
from raftlog.raft.state_rules import Rejected, accepted, rejected
from raftlog.raft.state_streams import (
    authority_clear_override,
    authority_set_override,
    authority_set_pinned,
    stream_create,
    stream_delete,
    stream_promote,
    stream_promotes,
    stream_update,
)
from raftlog.raft.state_users import user_delete, user_put, user_tokens


def apply(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    """Applies one command; returns its result. Deterministic; never raises for any input."""
    kind = command.WhichOneof("command")
    handler = _HANDLERS.get(kind or "")
    if handler is None:
        return rejected(Reason.INVALID_ARGUMENT, f"unknown or empty command {kind!r}")
    try:
        return handler(state, command)
    except Rejected as rejection:
        return rejected(rejection.reason, rejection.message)


def _barrier(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    return accepted(changed=False)


_HANDLERS: dict[str, Callable[[MetaState, raft_pb2.RaftCommand], raft_pb2.RaftResult]] = {
    "member_join": member_join,
    "member_leave": member_leave,
    "member_set_status": member_set_status,
    "stream_create": stream_create,
    "stream_update": stream_update,
    "stream_delete": stream_delete,
    "authority_set_override": authority_set_override,
    "authority_clear_override": authority_clear_override,
    "authority_set_pinned": authority_set_pinned,
    "stream_promote": stream_promote,
    "stream_promotes": stream_promotes,
    "consumer_create": consumer_create,
    "consumer_delete": consumer_delete,
    "consumer_state_update": consumer_state_update,
    "consumer_state_set": consumer_state_set,
    "barrier": _barrier,
    "user_put": user_put,
    "user_delete": user_delete,
    "user_tokens": user_tokens,
}
