"""What a user's rules allow (node/transport/auth_rules.py), and how a call's credentials become
an identity (node/transport/auth.py's Authenticator), without a server."""

from __future__ import annotations

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.transport import auth
from raftlog.node.transport.auth_rules import covers, may_publish, may_subscribe
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential

SECRET = "0123456789abcdef" * 4
PUBLISH = "/raftlog.v1.Streams/Publish"

EU = raft_pb2.UserRules(publish_allow=["orders.eu.>"], publish_deny=["orders.eu.secret"],
                        subscribe_allow=["orders.eu.>", "audit.*"],
                        subscribe_deny=["orders.eu.pii.>"])


@pytest.mark.parametrize(("allow", "pattern", "covered"), [
    (">", "a.b", True), ("a.>", "a.b.c", True), ("a.>", "a", False), ("a.*", "a.b", True),
    ("a.*", "a.*", True), ("a.*", "a.>", False), ("a.b", "a.*", False), ("a.*.c", "a.x.c", True),
    ("a.>", "a.>", True), ("a.>", "a.*", True), ("a.b", "a.b", True), ("a.b", "a.b.c", False),
])
def test_an_allow_pattern_covers_only_subjects_it_matches(allow: str, pattern: str,
                                                          covered: bool) -> None:
    assert covers(allow, pattern) is covered


@pytest.mark.parametrize(("subject", "allowed"), [
    ("orders.eu.x", True), ("orders.eu.x.y", True), ("orders.us.x", False),
    ("orders.eu", False), ("orders.eu.secret", False), ("other", False),
])
def test_publish_needs_an_allow_and_no_deny(subject: str, allowed: bool) -> None:
    assert may_publish(EU, subject) is allowed


@pytest.mark.parametrize(("patterns", "allowed"), [
    (["orders.eu.>"], False),  # reaches orders.eu.pii.>, which is denied
    (["orders.eu.public.>"], True), (["orders.eu.*"], True), (["audit.x"], True),
    (["audit.>"], False), (["orders.>"], False), (["orders.eu.x", "orders.us.x"], False),
    ([], False),
])
def test_subscribe_needs_every_pattern_covered_and_none_touching_a_deny(
        patterns: list[str], allowed: bool) -> None:
    assert may_subscribe(EU, patterns) is allowed


def test_empty_rules_allow_nothing() -> None:
    rules = raft_pb2.UserRules()
    assert not may_publish(rules, "a") and not may_subscribe(rules, ["a"])


# --------------------------------------------------------------------------- authenticating

def users_with(token: str) -> dict[str, raft_pb2.UserRecord]:
    record = raft_pb2.TokenRecord(sha256=auth.token_sha256(token),
                                  hmac_key=auth.rocketmq_key(token))
    return {"eu": raft_pb2.UserRecord(name="eu", tokens=[record], tls_subject="eu-client",
                                      rules=EU)}


def authenticator(users: dict[str, raft_pb2.UserRecord]) -> auth.Authenticator:
    return auth.Authenticator(users=lambda: users, credential=Credential(SECRET),
                              subjects_of=lambda stream, consumer: ["orders.eu.>"])


def refused(call_metadata: list[tuple[str, str]], users: dict[str, raft_pb2.UserRecord],
            method: str = PUBLISH) -> Reason:
    with pytest.raises(RaftlogError) as raised:
        authenticator(users).identify(method, call_metadata)
    return raised.value.reason


def test_with_no_user_every_call_is_the_system() -> None:
    assert authenticator({}).identify(PUBLISH, []) is auth.SYSTEM


def test_a_bearer_token_names_its_user_and_a_wrong_one_is_refused() -> None:
    users = users_with("rl_good")
    identity = authenticator(users).identify(PUBLISH, [("authorization", "Bearer rl_good")])
    assert identity.name == "eu" and identity.rules == EU
    assert refused([("authorization", "Bearer rl_bad")], users) is Reason.UNAUTHENTICATED
    assert refused([], users) is Reason.UNAUTHENTICATED


def test_a_certificate_subject_names_its_user() -> None:
    identity = authenticator(users_with("t")).identify(PUBLISH, [], ["eu-client"])
    assert identity.name == "eu"


def test_the_cluster_credential_is_unrestricted_for_its_own_method_only() -> None:
    users = users_with("t")
    admin = Credential(SECRET).token(principal="admin", method=PUBLISH)
    assert authenticator(users).identify(PUBLISH, [(ADMIN_TOKEN_HEADER, admin)]) is auth.SYSTEM
    assert refused([(ADMIN_TOKEN_HEADER, admin)], users, "/raftlog.v1.Streams/DeleteStream"
                   ) is Reason.UNAUTHENTICATED


def test_a_forwarded_identity_must_be_signed_for_the_method() -> None:
    users = users_with("t")
    headers = auth.identity_headers(Credential(SECRET))
    token = auth._current.set(authenticator(users).identify(
        PUBLISH, [("authorization", "Bearer t")]))
    try:
        signed = headers(PUBLISH)
    finally:
        auth._current.reset(token)
    assert authenticator(users).identify(PUBLISH, signed).name == "eu"
    assert refused(signed, users, "/raftlog.v1.Streams/DeleteStream") is Reason.UNAUTHENTICATED
    forged = Credential("f" * 64).token(principal="user-eu", method=PUBLISH)
    assert refused([(auth.IDENTITY_HEADER, forged)], users) is Reason.UNAUTHENTICATED
    # Even with auth off a forged header is refused: only members sign identities.
    assert refused([(auth.IDENTITY_HEADER, forged)], {}) is Reason.UNAUTHENTICATED


def test_a_rocketmq_signature_verifies_with_the_users_key() -> None:
    from datetime import UTC, datetime
    users = users_with("rl_tok")
    date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")

    def header(key: str, user: str = "eu") -> list[tuple[str, str]]:
        signature = auth.mq_signature(key, date_time)
        return [("authorization", f"MQv2-HMAC-SHA1 Credential={user}/ns, "
                 f"SignedHeaders=x-mq-date-time, Signature={signature}"),
                (auth.MQ_DATE_HEADER, date_time)]

    good = authenticator(users).identify(PUBLISH, header(auth.rocketmq_key("rl_tok")))
    assert good.name == "eu"
    assert refused(header("wrong"), users) is Reason.UNAUTHENTICATED
    assert refused(header(auth.rocketmq_key("rl_tok"), user="nobody"), users
                   ) is Reason.UNAUTHENTICATED


def test_an_identity_checks_publish_subscribe_and_admin() -> None:
    identity = authenticator(users_with("t")).identify(PUBLISH, [("authorization", "Bearer t")])
    identity.require_publish("orders.eu.a")
    with pytest.raises(RaftlogError) as raised:
        identity.require_publish("orders.us.a")
    assert raised.value.reason is Reason.PERMISSION_DENIED
    with pytest.raises(RaftlogError):
        identity.require_subscribe("orders")  # subjects_of: orders.eu.> touches the pii deny
    with pytest.raises(RaftlogError):
        identity.require_admin("stream")
    auth.SYSTEM.require_admin("cluster")
    auth.SYSTEM.require_publish("anything")


def test_before_its_users_are_applied_again_a_node_does_not_take_no_users_for_auth_off() -> None:
    """Right after a restart the metadata may not hold its users yet (pysyncobj applies the
    journal again on its own thread): every call is CATCHING_UP, not served as the system,
    except one with the cluster credential; once loaded, the users decide as usual."""
    loaded = [False]

    def with_users(users: dict[str, raft_pb2.UserRecord]) -> auth.Authenticator:
        return auth.Authenticator(users=lambda: users, credential=Credential(SECRET),
                                  subjects_of=lambda stream, consumer: [">"],
                                  users_loaded=lambda: loaded[0])

    def reason(users: dict[str, raft_pb2.UserRecord], metadata: list[tuple[str, str]]
               ) -> Reason | None:
        try:
            with_users(users).identify(PUBLISH, metadata)
        except RaftlogError as err:
            assert err.reason is not Reason.CATCHING_UP or int(err.metadata["retry_after_ms"]) > 0
            return err.reason
        return None

    forwarded = Credential(SECRET).token(principal="user-eu", method=PUBLISH)
    admin = Credential(SECRET).token(principal="admin", method=PUBLISH)
    assert reason({}, []) is Reason.CATCHING_UP
    assert reason({}, [("authorization", "Bearer t")]) is Reason.CATCHING_UP
    assert reason({}, [(auth.IDENTITY_HEADER, forwarded)]) is Reason.CATCHING_UP
    assert reason({}, [(ADMIN_TOKEN_HEADER, admin)]) is None
    assert reason(users_with("t"), []) is Reason.UNAUTHENTICATED  # users known: as usual
    loaded[0] = True
    assert with_users({}).identify(PUBLISH, []) is auth.SYSTEM
    assert reason({}, [(auth.IDENTITY_HEADER, forwarded)]) is Reason.UNAUTHENTICATED
