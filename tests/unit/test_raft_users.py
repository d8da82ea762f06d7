"""The users of the metadata state machine (raft/state_users.py): one test per rule, named
after it, and the snapshot keeping them."""

from __future__ import annotations

import hashlib

from raftlog.base.errors import Reason
from raftlog.internal import raft_pb2
from raftlog.raft import commands as c
from raftlog.raft.state import apply
from raftlog.raft.state_model import MetaState, check_invariants, tokens_per_user_max
from raftlog.raft.state_snapshot import encode_snapshot, from_snapshot, to_snapshot
from raftlog.raft.state_users import reserved_bytes
from raftlog.v1 import types_pb2

NOW_MS = 1_700_000_000_000


def token(text: str) -> raft_pb2.TokenRecord:
    return raft_pb2.TokenRecord(sha256=hashlib.sha256(text.encode()).hexdigest(),
                                hmac_key="k-" + text, created_ms=NOW_MS)


def user(name: str, *tokens: str, tls_subject: str = "",
         publish: tuple[str, ...] = ("orders.eu.>",)) -> raft_pb2.UserRecord:
    return raft_pb2.UserRecord(name=name, tokens=[token(t) for t in tokens],
                               tls_subject=tls_subject,
                               rules=raft_pb2.UserRules(publish_allow=publish))


def add(state: MetaState, record: raft_pb2.UserRecord) -> raft_pb2.RaftResult:
    return apply(state, c.user_put(user=record, create=True, now_ms=NOW_MS))


def rejected_unchanged(state: MetaState, command: raft_pb2.RaftCommand, reason: Reason) -> None:
    before = to_snapshot(state).SerializeToString()
    result = apply(state, command)
    assert not result.ok and result.reason == reason.name, result
    assert to_snapshot(state).SerializeToString() == before


def test_a_user_name_is_unique_and_well_formed() -> None:
    state = MetaState()
    assert add(state, user("eu", "t1")).ok
    rejected_unchanged(state, c.user_put(user=user("eu", "t2"), create=True), Reason.USER_EXISTS)
    for bad in ("", "a.b", "x" * 65, "sp ace"):
        rejected_unchanged(state, c.user_put(user=user(bad, "t3"), create=True),
                           Reason.INVALID_NAME)


def test_a_replace_delete_or_token_change_of_an_unknown_user_is_user_not_found() -> None:
    state = MetaState()
    for command in (c.user_put(user=user("ghost"), create=False), c.user_delete(name="ghost"),
                    c.user_tokens(name="ghost", add=[token("t")])):
        rejected_unchanged(state, command, Reason.USER_NOT_FOUND)


def test_every_pattern_is_a_valid_subject_pattern() -> None:
    state = MetaState()
    rejected_unchanged(state, c.user_put(user=user("u", "t", publish=("orders..x",)),
                                         create=True), Reason.INVALID_SUBJECT)
    rejected_unchanged(state, c.user_put(user=user("u", "t", publish=("a.>.b",)), create=True),
                       Reason.INVALID_SUBJECT)


def test_a_token_belongs_to_one_user_only_and_is_a_sha256() -> None:
    state = MetaState()
    assert add(state, user("a", "shared")).ok
    rejected_unchanged(state, c.user_put(user=user("b", "shared"), create=True),
                       Reason.INVALID_ARGUMENT)
    rejected_unchanged(state, c.user_tokens(name="a", add=[token("shared")]),
                       Reason.INVALID_ARGUMENT)
    bad = raft_pb2.TokenRecord(sha256="NOT-HEX")
    rejected_unchanged(state, c.user_tokens(name="a", add=[bad]), Reason.INVALID_ARGUMENT)


def test_a_user_holds_at_most_tokens_per_user_max_tokens() -> None:
    state = MetaState()
    assert add(state, user("a", "t0")).ok
    for k in range(1, tokens_per_user_max):
        assert apply(state, c.user_tokens(name="a", add=[token(f"t{k}")])).ok
    rejected_unchanged(state, c.user_tokens(name="a", add=[token("one-more")]),
                       Reason.INVALID_ARGUMENT)


def test_a_tls_subject_names_at_most_one_user() -> None:
    state = MetaState()
    assert add(state, user("a", "t1", tls_subject="client-a")).ok
    rejected_unchanged(state, c.user_put(user=user("b", "t2", tls_subject="client-a"),
                                         create=True), Reason.USER_EXISTS)


def test_a_replace_keeps_the_users_tokens_and_creation_time() -> None:
    state = MetaState()
    assert add(state, user("a", "t1")).ok
    replaced = user("a", publish=("orders.>",))
    assert apply(state, c.user_put(user=replaced, create=False, now_ms=NOW_MS + 5)).ok
    stored = state.users["a"]
    assert [t.sha256 for t in stored.tokens] == [token("t1").sha256]
    assert list(stored.rules.publish_allow) == ["orders.>"]
    assert (stored.created_ms, stored.updated_ms) == (NOW_MS, NOW_MS + 5)


def test_rotation_adds_a_token_and_revoke_keeps_only_the_newest() -> None:
    state = MetaState()
    assert add(state, user("a", "old")).ok
    assert apply(state, c.user_tokens(name="a", add=[token("new")])).ok
    assert [t.hmac_key for t in state.users["a"].tokens] == ["k-old", "k-new"]
    assert apply(state, c.user_tokens(name="a", keep_newest_only=True)).ok
    assert [t.hmac_key for t in state.users["a"].tokens] == ["k-new"]
    again = apply(state, c.user_tokens(name="a", keep_newest_only=True))
    assert again.ok and not again.changed


def test_deleting_the_last_user_leaves_no_users() -> None:
    state = MetaState()
    assert add(state, user("a", "t")).ok
    assert apply(state, c.user_delete(name="a")).ok
    assert state.users == {}


def test_the_snapshot_keeps_the_users_and_both_encodings_agree() -> None:
    state = MetaState()
    assert add(state, user("b", "t2", tls_subject="cn-b")).ok
    assert add(state, user("a", "t1")).ok
    check_invariants(state)
    encoded = encode_snapshot(state)
    assert encoded == to_snapshot(state).SerializeToString()
    restored = from_snapshot(raft_pb2.RaftSnapshot.FromString(encoded))
    assert restored.users == state.users
    assert [u.name for u in to_snapshot(restored).users] == ["a", "b"]


def _with_members(state: MetaState) -> None:
    for node_id in ("n1", "n2", "n3"):
        assert apply(state, c.member_join(node_id=node_id, raft_address=f"raft-{node_id}:1",
                                          grpc_address=f"grpc-{node_id}:2", now_ms=NOW_MS)).ok


def _stream(name: str, max_bytes: int, owner: str = "quota") -> raft_pb2.RaftCommand:
    return c.stream_create(config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"],
                                                         max_bytes=max_bytes),
                           replicas=("n1", "n2", "n3"), primary="n1", now_ms=NOW_MS,
                           owner=owner)


def test_a_user_with_max_bytes_stored_owns_streams_whose_max_bytes_add_up_to_at_most_it() -> None:
    state = MetaState()
    _with_members(state)
    record = user("quota", "t")
    record.max_bytes_stored = 1000
    assert add(state, record).ok
    rejected_unchanged(state, _stream("unbounded", 0), Reason.QUOTA_EXCEEDED)
    assert apply(state, _stream("a", 600)).ok
    rejected_unchanged(state, _stream("b", 500), Reason.QUOTA_EXCEEDED)
    assert apply(state, _stream("b", 400)).ok
    assert reserved_bytes(state, "quota") == 1000
    # Growing one past the sum is refused; shrinking one makes room for another.
    grown = types_pb2.StreamConfig(name="a", subjects=["a.>"], max_bytes=700)
    rejected_unchanged(state, c.stream_update(name="a", config=grown), Reason.QUOTA_EXCEEDED)
    shrunk = types_pb2.StreamConfig(name="a", subjects=["a.>"], max_bytes=100)
    assert apply(state, c.stream_update(name="a", config=shrunk)).ok
    assert apply(state, _stream("c", 500)).ok
    # Other owners, and streams without one, are not counted; the owner is kept.
    assert apply(state, _stream("free", 0, owner="")).ok
    assert apply(state, _stream("other", 10**9, owner="someone-else")).ok
    assert reserved_bytes(state, "quota") == 1000
    assert state.streams["c"].owner == "quota" and state.streams["free"].owner == ""
    # A quota lowered below what is held takes nothing away and refuses the next create.
    lowered = user("quota")
    lowered.max_bytes_stored = 10
    assert apply(state, c.user_put(user=lowered, create=False, now_ms=NOW_MS)).ok
    assert "a" in state.streams and "c" in state.streams
    rejected_unchanged(state, _stream("d", 1), Reason.QUOTA_EXCEEDED)
    # Deleting a stream gives its bytes back.
    assert apply(state, c.stream_delete(name="c")).ok
    assert reserved_bytes(state, "quota") == 500


def test_the_snapshot_keeps_each_stream_owner_and_the_user_quotas() -> None:
    state = MetaState()
    _with_members(state)
    record = user("quota", "t")
    record.max_bytes_stored, record.max_connections, record.max_subscriptions = 1000, 2, 3
    assert add(state, record).ok
    assert apply(state, _stream("a", 600)).ok
    encoded = encode_snapshot(state)
    assert encoded == to_snapshot(state).SerializeToString()
    restored = from_snapshot(raft_pb2.RaftSnapshot.FromString(encoded))
    assert restored.streams["a"].owner == "quota"
    assert restored.users["quota"].max_subscriptions == 3
    check_invariants(restored)
