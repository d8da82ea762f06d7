"""Who is calling, and whether they may (docs/auth.md).

Authentication is off while the cluster's metadata holds no user; once one exists, every call
on the client port must name a user, one of:

- `authorization: Bearer <token>`: a token of the user (the cluster keeps its SHA-256 only);
- `authorization: MQv2-HMAC-SHA1 Credential=<user>/..., SignedHeaders=x-mq-date-time,
  Signature=<hex>` with `x-mq-date-time` (the RocketMQ clients' signature): HMAC-SHA1 of the
  date-time under one of the user's RocketMQ keys;
- a client certificate whose common name is a user's TLS subject (mutual TLS);
- the cluster credential (`raftlog-admin-token` for the called method): unrestricted;
- `raftlog-identity`: the identity a forwarding node verified, as a call token signed with the
  cluster credential for the forwarded method (credentials.py). A client cannot make one, and
  the forwarder drops any a client sent (calls.py).

`AuthInterceptor` settles the identity before the servicer runs and keeps it in `current` for
the call; the operations layer asks `current()` before it acts (`require_publish`,
`require_subscribe`, `require_admin`), on the node that received the call and again on the
node a forwarded call reaches. Work a node starts by itself (source tails, scheduled
deliveries) runs as SYSTEM, which may do anything.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.transport import rpc
from raftlog.node.transport.auth_rules import may_publish, may_subscribe
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential

AUTHORIZATION_HEADER = "authorization"
IDENTITY_HEADER = "raftlog-identity"  # node to node only: a verified identity, signed
MQ_DATE_HEADER = "x-mq-date-time"
_BEARER = "bearer "
_MQ_SCHEME = "MQv2-HMAC-SHA1"
_MQ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_SYSTEM_PRINCIPAL = "system"
_USER_PRINCIPAL = "user-"
_HMAC_KEY_LABEL = b"raftlog rocketmq key v1"
# Calls that stay open to everyone: health checks, reflection and the cluster's status say
# nothing about the data, and tools that wait for a cluster to form (`raftlog cluster up`)
# read them without a user.
OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                "/grpc.reflection.v1.ServerReflection/", "/raftlog.v1.Cluster/GetClusterStatus")

Users = Callable[[], Mapping[str, raft_pb2.UserRecord]]
Subjects = Callable[[str, str], list[str]]  # (stream, consumer) -> the patterns read


# ------------------------------------------------------------------------------ tokens

def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def rocketmq_key(token: str) -> str:
    """The key a RocketMQ client signs with for `token` (its secret key)."""
    return hmac.new(_HMAC_KEY_LABEL, token.encode(), hashlib.sha256).hexdigest()


def new_token(*, now_ms: int) -> tuple[str, raft_pb2.TokenRecord]:
    """A fresh random token and the record the cluster keeps of it."""
    token = "rl_" + secrets.token_urlsafe(limits.user_token_bytes)
    return token, raft_pb2.TokenRecord(sha256=token_sha256(token), hmac_key=rocketmq_key(token),
                                       created_ms=now_ms)


def mq_signature(secret_key: str, date_time: str) -> str:
    """The RocketMQ clients' signature of a request: hex HMAC-SHA1 of its date-time."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


# ------------------------------------------------------------------------------ identity

@dataclass(frozen=True)
class Identity:
    """Who a call runs as: a user with its rules, or SYSTEM (`rules` None: unrestricted)."""

    name: str
    rules: raft_pb2.UserRules | None = None
    subjects_of: Subjects | None = field(default=None, compare=False)
    # The user's publish rates (0 = none), charged where the call arrived: `forwarded` says
    # another node verified this identity, and charged it already (docs/quotas.md).
    max_msgs_per_s: int = 0
    max_bytes_per_s: int = 0
    forwarded: bool = False
    # Connections and Subscribe calls the user may hold open on one node (0 = no quota),
    # counted where the call arrived (node/transport/user_limits.py).
    max_connections: int = 0
    max_subscriptions: int = 0

    def require_publish(self, subject: str) -> None:
        if self.rules is not None and not may_publish(self.rules, subject):
            raise _denied(self.name, f"may not publish to {subject!r}", subject=subject)

    def require_subscribe(self, stream: str, consumer: str = "") -> None:
        """May read the stream (through `consumer`'s filter when named)."""
        if self.rules is None:
            return
        patterns = self.subjects_of(stream, consumer) if self.subjects_of else [">"]
        if not may_subscribe(self.rules, patterns):
            raise _denied(self.name, f"may not read {', '.join(patterns)} of stream {stream!r}",
                          stream=stream)

    def require_subject_read(self, subject: str) -> None:
        if self.rules is not None and not may_subscribe(self.rules, [subject]):
            raise _denied(self.name, f"may not read {subject!r}", subject=subject)

    def require_admin(self, what: str) -> None:
        """`what`: "stream", "consumer" or "cluster"."""
        if self.rules is None:
            return
        allowed = {"stream": self.rules.stream_admin, "consumer": self.rules.consumer_admin,
                   "cluster": self.rules.cluster_admin}[what]
        if not allowed:
            raise _denied(self.name, f"may not administer {what}s", needs=f"{what}_admin")


SYSTEM = Identity(name="")
_current: ContextVar[Identity] = ContextVar("raftlog_identity", default=SYSTEM)


def current() -> Identity:
    """The identity the running call acts as (SYSTEM outside a call, or with auth off)."""
    return _current.get()


def _denied(user: str, what: str, **metadata: str) -> RaftlogError:
    return RaftlogError(Reason.PERMISSION_DENIED, f"user {user!r} {what}", user=user,
                        **metadata)


def _refused(message: str) -> RaftlogError:
    return RaftlogError(Reason.UNAUTHENTICATED, message)


def _not_loaded() -> RaftlogError:
    return RaftlogError(Reason.CATCHING_UP, "this node has not applied its users again since "
                        "it started, so it cannot tell yet whether authentication is on; retry",
                        retry_after_ms=limits.catching_up_retry_after_ms)


# ------------------------------------------------------------------------------ authenticating

class Authenticator:
    """Turns a call's credentials into an Identity, against the users the metadata holds."""

    def __init__(self, *, users: Users, credential: Credential, subjects_of: Subjects,
                 clock: Clock | None = None,
                 users_loaded: Callable[[], bool] | None = None) -> None:
        """`users_loaded()`: the metadata this node held when it (re)started is applied again
        (default: always). Until then an empty user list may be users not replayed yet, not
        authentication off: such a call is CATCHING_UP, unless it carries the cluster
        credential."""
        self._users = users
        self._credential = credential
        self._subjects_of = subjects_of
        self._clock = clock or SystemClock()
        self._users_loaded = users_loaded or (lambda: True)

    def identify(self, method: str, metadata: Iterable[tuple[str, Any]],
                 tls_subjects: Iterable[str] = ()) -> Identity:
        """Raises UNAUTHENTICATED when auth is on and nothing names a user."""
        headers: dict[str, str] = {}
        for key, value in metadata:
            headers.setdefault(key, value if isinstance(value, str)
                               else bytes(value).decode("replace"))
        users = self._users()
        forwarded = headers.get(IDENTITY_HEADER)
        if forwarded is not None:
            return self._forwarded(forwarded, method, users)
        if not users and self._users_loaded():
            return SYSTEM
        admin = headers.get(ADMIN_TOKEN_HEADER)
        if admin is not None and self._admin(admin, method):
            return SYSTEM
        if not users:
            raise _not_loaded()
        authorization = headers.get(AUTHORIZATION_HEADER, "")
        if authorization[:len(_BEARER)].lower() == _BEARER:
            return self._bearer(authorization[len(_BEARER):].strip(), users)
        if authorization.startswith(_MQ_SCHEME):
            return self._mq_signed(authorization, headers.get(MQ_DATE_HEADER, ""), users)
        for subject in tls_subjects:
            for user in users.values():
                if user.tls_subject and user.tls_subject == subject:
                    return self._as(user)
        raise _refused("this cluster requires a credential: send `authorization: Bearer "
                       "<token>` (the CLI's --token or RAFTLOG_TOKEN)")

    def _as(self, user: raft_pb2.UserRecord, *, forwarded: bool = False) -> Identity:
        return Identity(name=user.name, rules=user.rules, subjects_of=self._subjects_of,
                        max_msgs_per_s=user.max_msgs_per_s,
                        max_bytes_per_s=user.max_bytes_per_s, forwarded=forwarded,
                        max_connections=user.max_connections,
                        max_subscriptions=user.max_subscriptions)

    def _admin(self, token: str, method: str) -> bool:
        try:
            self._credential.verify(token, method=method)
        except RaftlogError:
            return False
        return True

    def _forwarded(self, token: str, method: str,
                   users: Mapping[str, raft_pb2.UserRecord]) -> Identity:
        principal = self._credential.verify(token, method=method).principal
        if principal == _SYSTEM_PRINCIPAL:
            return SYSTEM
        if principal.startswith(_USER_PRINCIPAL):
            user = users.get(principal[len(_USER_PRINCIPAL):])
            if user is not None:
                return self._as(user, forwarded=True)
            if not users and not self._users_loaded():
                raise _not_loaded()
        raise _refused(f"the forwarded identity {principal!r} names no user")

    def _bearer(self, token: str, users: Mapping[str, raft_pb2.UserRecord]) -> Identity:
        if not token or len(token) > limits.call_token_bytes_max:
            raise _refused("the bearer token is empty or too long")
        digest = token_sha256(token)
        for user in users.values():
            if any(hmac.compare_digest(record.sha256, digest) for record in user.tokens):
                return self._as(user)
        raise _refused("the bearer token names no user of this cluster")

    def _mq_signed(self, authorization: str, date_time: str,
                   users: Mapping[str, raft_pb2.UserRecord]) -> Identity:
        fields = dict(part.strip().partition("=")[::2]
                      for part in authorization[len(_MQ_SCHEME):].split(","))
        access_key = fields.get("Credential", "").split("/")[0]
        signature = fields.get("Signature", "").lower()
        user = users.get(access_key)
        if user is None or not signature:
            raise _refused("the RocketMQ signature names no user of this cluster")
        self._check_date(date_time)
        for record in user.tokens:
            if hmac.compare_digest(mq_signature(record.hmac_key, date_time), signature):
                return self._as(user)
        raise _refused(f"the RocketMQ signature of {access_key!r} does not verify")

    def _check_date(self, date_time: str) -> None:
        try:
            signed = datetime.strptime(date_time, _MQ_DATE_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            raise _refused(f"{MQ_DATE_HEADER} {date_time!r} is not yyyyMMddTHHmmssZ") from None
        skew_ms = abs(self._clock.wall_ms() - int(signed.timestamp() * 1000))
        if skew_ms > limits.call_token_skew_ms_max:
            raise _refused(f"{MQ_DATE_HEADER} is more than {limits.call_token_skew_ms_max} ms "
                           "away from this node's clock")


def identity_headers(credential: Credential) -> Callable[[str], list[tuple[str, str]]]:
    """For the forwarder: the header that carries the running call's identity to the node
    serving `path`, signed for that method."""
    def headers(path: str) -> list[tuple[str, str]]:
        name = current().name
        principal = f"{_USER_PRINCIPAL}{name}" if name else _SYSTEM_PRINCIPAL
        return [(IDENTITY_HEADER, credential.token(principal=principal, method=path))]
    return headers


def _tls_subjects(context: Any) -> list[str]:
    auth_context = getattr(context, "auth_context", None)
    if auth_context is None:
        return []
    names = auth_context().get("x509_common_name", [])
    return [name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
            for name in names]


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Settles each client-port call's identity before its servicer runs (a refusal is
    UNAUTHENTICATED with ErrorInfo) and keeps it in `current` while the call runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        method = str(details.method)
        if handler is None or method.startswith(OPEN_METHODS):
            return handler
        metadata = tuple(details.invocation_metadata or ())
        identify = self._identify(method, metadata)
        wrap = {"unary_unary": (_unary, grpc.unary_unary_rpc_method_handler),
                "stream_unary": (_unary, grpc.stream_unary_rpc_method_handler),
                "unary_stream": (_streaming, grpc.unary_stream_rpc_method_handler),
                "stream_stream": (_streaming, grpc.stream_stream_rpc_method_handler)}
        for kind, (wrapper, make) in wrap.items():
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                return make(wrapper(behaviour, identify),
                            request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler

    def _identify(self, method: str, metadata: tuple[Any, ...]) -> Callable[[Any], Identity]:
        def identify(context: Any) -> Identity:
            return self._authenticator.identify(method, metadata, _tls_subjects(context))
        return identify


def _unary(behaviour: Callable[..., Any], identify: Callable[[Any], Identity]
           ) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: Any) -> Any:
        try:
            _current.set(identify(context))
        except RaftlogError as err:
            await rpc.abort(context, err)
        result = behaviour(request, context)
        return await result if hasattr(result, "__await__") else result
    return wrapper


def _streaming(behaviour: Callable[..., Any], identify: Callable[[Any], Identity]
               ) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            _current.set(identify(context))
        except RaftlogError as err:
            await rpc.abort(context, err)
        async for item in behaviour(request, context):
            yield item
    return wrapper
