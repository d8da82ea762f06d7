"""Per-user connections and subscriptions held open on one node (node/transport/
user_limits.py)."""

from __future__ import annotations

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.transport.auth import SYSTEM, Identity
from raftlog.node.transport.user_limits import UserSessions

RULES = raft_pb2.UserRules(publish_allow=[">"])


def refused(sessions: UserSessions, identity: Identity, peer: str, *,
            subscription: bool = False) -> RaftlogError:
    with pytest.raises(RaftlogError) as caught:
        sessions.take(identity, peer=peer, subscription=subscription)
    assert caught.value.reason is Reason.QUOTA_EXCEEDED
    assert int(caught.value.metadata["retry_after_ms"]) > 0
    return caught.value


def test_connections_count_peers_with_calls_open_and_come_back_when_the_calls_end() -> None:
    sessions = UserSessions()
    eu = Identity(name="eu", rules=RULES, max_connections=2)
    first = sessions.take(eu, peer="ipv4:127.0.0.1:1", subscription=False)
    again = sessions.take(eu, peer="ipv4:127.0.0.1:1", subscription=False)  # same connection
    second = sessions.take(eu, peer="ipv4:127.0.0.1:2", subscription=False)
    assert sessions.connections("eu") == 2
    err = refused(sessions, eu, "ipv4:127.0.0.1:3")
    assert err.metadata["measure"] == "connections" and err.metadata["limit"] == "2"
    # Another user has its own count.
    other = sessions.take(Identity(name="us", rules=RULES, max_connections=1),
                          peer="ipv4:127.0.0.1:3", subscription=False)
    first()
    assert sessions.connections("eu") == 2  # the first connection still has a call open
    again()
    assert sessions.connections("eu") == 1
    sessions.take(eu, peer="ipv4:127.0.0.1:3", subscription=False)()
    second()
    other()
    assert sessions.connections("eu") == 0 and sessions.connections("us") == 0


def test_subscriptions_are_bounded_per_user_and_a_refusal_holds_nothing() -> None:
    sessions = UserSessions()
    reader = Identity(name="reader", rules=RULES, max_subscriptions=1)
    held = sessions.take(reader, peer="p1", subscription=True)
    unary = sessions.take(reader, peer="p1", subscription=False)  # not a subscription
    err = refused(sessions, reader, "p1", subscription=True)
    assert err.metadata["measure"] == "subscriptions"
    assert sessions.subscriptions("reader") == 1 and sessions.connections("reader") == 1
    held()
    sessions.take(reader, peer="p2", subscription=True)()
    unary()
    assert sessions.subscriptions("reader") == 0 and sessions.connections("reader") == 0


def test_system_forwarded_calls_and_users_without_quotas_are_not_counted() -> None:
    sessions = UserSessions()
    forwarded = Identity(name="eu", rules=RULES, max_connections=1, forwarded=True)
    free = Identity(name="free", rules=RULES)
    for identity in (SYSTEM, forwarded, free):
        for peer in ("a", "b", "c"):
            sessions.take(identity, peer=peer, subscription=True)
    assert sessions.connections("eu") == 0 and sessions.connections("free") == 0
