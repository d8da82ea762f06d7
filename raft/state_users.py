"""Users of the metadata state machine: add or replace (`user_put`), remove (`user_delete`),
and change a user's tokens (`user_tokens`): the handlers `apply` calls.

A user is kept as its `UserRecord` protobuf: a name, the hashes of its tokens, its publish
rates (charged by the node: node/ops/quotas.py), an optional client-certificate subject and its
rules. The rules' meaning (deny wins, NATS patterns) belongs to the node
(node/transport/auth_rules.py); here they are only checked to be well formed, so a stored rule
always parses.

Rules (tests/unit/test_raft_users.py has a test named after each):
- a user name is 1..64 of [A-Za-z0-9_-] and unique (USER_EXISTS on a create, USER_NOT_FOUND on
  a replace, a delete or a token change of an unknown user);
- every pattern is a valid subject pattern; at most user_patterns_max in one user's rules;
- a token hash is 64 lowercase hex digits and belongs to one user only; a user holds at most
  tokens_per_user_max tokens;
- a TLS subject names at most one user;
- a replace keeps the user's tokens and creation time;
- a user with max_bytes_stored owns streams whose max_bytes add up to at most that: each of
  its streams has a max_bytes, and a create or update past the sum is QUOTA_EXCEEDED
  (`check_storage`, called by the stream handlers). A quota lowered below what the user holds
  already refuses the next create or growth, and takes nothing away.

A stored record is never changed in place: a change stores a new one, so a reader that copied
the dict of users (under the group's read lock) holds records no later command alters.
"""

from __future__ import annotations

import re

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    MetaState,
    address_bytes_max,
    tokens_per_user_max,
    user_patterns_max,
    users_max,
)
from raftlog.raft.state_rules import Rejected, accepted, require

_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def user_put(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    put = command.user_put
    user = put.user
    _check_name(user.name)
    existing = state.users.get(user.name)
    if put.create:
        require(existing is None, Reason.USER_EXISTS, f"user {user.name!r} exists")
        require(len(state.users) < users_max, Reason.INVALID_ARGUMENT,
                f"a cluster has at most {users_max} users")
        _check_tokens(state, user.name, list(user.tokens))
    else:
        require(existing is not None, Reason.USER_NOT_FOUND, f"user {user.name!r} not found")
    _check_rules(user.rules)
    _check_tls_subject(state, user.name, user.tls_subject)
    record = raft_pb2.UserRecord()
    record.CopyFrom(user)
    if existing is not None:
        del record.tokens[:]
        record.tokens.extend(existing.tokens)
        record.created_ms = existing.created_ms
    else:
        record.created_ms = command.now_ms
    record.updated_ms = command.now_ms
    state.users[user.name] = record
    return accepted()


def user_delete(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    name = command.user_delete.name
    require(name in state.users, Reason.USER_NOT_FOUND, f"user {name!r} not found")
    del state.users[name]
    return accepted()


def user_tokens(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    change = command.user_tokens
    user = state.users.get(change.name)
    if user is None:
        raise Rejected(Reason.USER_NOT_FOUND, f"user {change.name!r} not found")
    tokens = [*user.tokens, *change.add]
    if change.keep_newest_only:
        tokens = tokens[-1:]
    _check_tokens(state, change.name, list(change.add))
    require(len(tokens) <= tokens_per_user_max, Reason.INVALID_ARGUMENT,
            f"a user holds at most {tokens_per_user_max} tokens: revoke the old ones first")
    if not change.add and len(tokens) == len(user.tokens):
        return accepted(changed=False)
    changed = raft_pb2.UserRecord()  # a new record: readers may hold the old one
    changed.CopyFrom(user)
    del changed.tokens[:]
    changed.tokens.extend(tokens)
    changed.updated_ms = command.now_ms
    state.users[change.name] = changed
    return accepted()


def reserved_bytes(state: MetaState, owner: str, *, besides: str = "") -> int:
    """The sum of max_bytes over the streams `owner` owns, but `besides`."""
    return sum(stream.config.max_bytes for stream in state.streams.values()
               if stream.owner == owner and stream.name != besides)


def check_storage(state: MetaState, *, owner: str, stream: str, max_bytes: int) -> None:
    """Stream `stream` of `owner` may bound itself at `max_bytes` (QUOTA_EXCEEDED if not)."""
    user = state.users.get(owner) if owner else None
    if user is None or not user.max_bytes_stored:
        return
    quota = user.max_bytes_stored
    require(max_bytes > 0, Reason.QUOTA_EXCEEDED,
            f"user {owner!r} may store {quota} bytes: stream {stream!r} needs a max_bytes "
            "within that")
    others = reserved_bytes(state, owner, besides=stream)
    require(others + max_bytes <= quota, Reason.QUOTA_EXCEEDED,
            f"user {owner!r} may store {quota} bytes and its other streams take {others}: "
            f"stream {stream!r} may have a max_bytes of at most {max(quota - others, 0)}")


def _check_name(name: str) -> None:
    require(_USER_NAME.fullmatch(name) is not None, Reason.INVALID_NAME,
            f"user name {name!r} must be 1..64 of [A-Za-z0-9_-]")


def _check_tokens(state: MetaState, name: str, added: list[raft_pb2.TokenRecord]) -> None:
    """New tokens are well formed, distinct and held by no user yet."""
    held = {token.sha256 for user in state.users.values() for token in user.tokens}
    seen: set[str] = set()
    for token in added:
        require(_SHA256_HEX.fullmatch(token.sha256) is not None, Reason.INVALID_ARGUMENT,
                "a token hash must be 64 lowercase hex digits")
        require(token.sha256 not in held and token.sha256 not in seen,
                Reason.INVALID_ARGUMENT, f"user {name!r}: the token is already in use")
        seen.add(token.sha256)
    require(len(added) <= tokens_per_user_max, Reason.INVALID_ARGUMENT,
            f"a user holds at most {tokens_per_user_max} tokens")


def _check_rules(rules: raft_pb2.UserRules) -> None:
    patterns = [*rules.publish_allow, *rules.publish_deny, *rules.subscribe_allow,
                *rules.subscribe_deny]
    require(len(patterns) <= user_patterns_max, Reason.INVALID_ARGUMENT,
            f"a user's rules hold at most {user_patterns_max} subject patterns")
    for pattern in patterns:
        try:
            subjects.validate_pattern(pattern)
        except RaftlogError as err:
            raise Rejected(err.reason, err.message) from None


def _check_tls_subject(state: MetaState, name: str, tls_subject: str) -> None:
    if not tls_subject:
        return
    require(len(tls_subject.encode()) <= address_bytes_max, Reason.INVALID_ARGUMENT,
            f"a TLS subject is at most {address_bytes_max} bytes")
    for other in state.users.values():
        require(other.name == name or other.tls_subject != tls_subject, Reason.USER_EXISTS,
                f"TLS subject {tls_subject!r} already names user {other.name!r}")
