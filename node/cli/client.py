"""A small asyncio client of one raftlog node, shared by the CLI and the benchmark.

`Client` owns one grpc.aio channel and the Streams, Consumers and Health stubs, and carries the
per-call deadline. `describe_failure` turns a failed call into the one line a person reads:
`REASON: message (metadata)` when the node sent a catalogued error, and a plain sentence when the
node could not be reached or did not answer in time.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.base import limits
from raftlog.node.cli import bearer
from raftlog.node.cli.format import error_text
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, consumers_pb2_grpc, streams_pb2_grpc

SERVER_ENV = "RAFTLOG_SERVER"
SECRET_FILE_ENV = "RAFTLOG_SECRET_FILE"
TLS_CA_ENV = "RAFTLOG_TLS_CA"
TLS_CERT_ENV = "RAFTLOG_TLS_CERT"
TLS_KEY_ENV = "RAFTLOG_TLS_KEY"
CLUSTER_SERVICE = cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name
server_default = "127.0.0.1:7400"
call_timeout_s_default = 10.0
health_poll_period_s = 0.1

# A fetch answer may carry fetch_bytes_max of payload plus framing; a batch may be as large as
# the node accepts. Both directions get the node's request limit.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", limits.request_bytes_max),
    ("grpc.max_send_message_length", limits.request_bytes_max),
]


def default_server() -> str:
    return os.environ.get(SERVER_ENV) or server_default


class Client:
    """`async with Client("127.0.0.1:7400", timeout_s=10) as client: await client.streams...`"""

    def __init__(self, address: str, *, timeout_s: float | None = call_timeout_s_default,
                 credential: Credential | None = None,
                 tls: grpc.ChannelCredentials | None = None, token: str | None = None) -> None:
        """`tls`: connect over TLS with these credentials (`tls_credentials`); None:
        plaintext. `token`: a user's bearer token, sent on every call (docs/auth.md)."""
        self.address = address
        self.timeout_s = timeout_s
        self.credential = credential
        sent = bearer.interceptors(token)
        self.channel = (grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS,
                                                  interceptors=sent)
                        if tls is None else
                        grpc.aio.secure_channel(address, tls, options=_CHANNEL_OPTIONS,
                                                interceptors=sent))
        # Generated *_pb2_grpc modules have no .pyi and set their methods in __init__: to mypy
        # the stubs are Any (the request and response messages are typed).
        self.streams: Any = streams_pb2_grpc.StreamsStub(self.channel)  # type: ignore[no-untyped-call]
        self.consumers: Any = consumers_pb2_grpc.ConsumersStub(self.channel)  # type: ignore[no-untyped-call]
        self.health: Any = health_pb2_grpc.HealthStub(self.channel)

    def admin(self, method: str) -> tuple[tuple[str, str], ...]:
        """Metadata for an admin call of the Cluster service (e.g. "JoinNode"): the cluster
        credential's token, or nothing when this client has none (the node then refuses)."""
        if self.credential is None:
            return ()
        path = f"/{CLUSTER_SERVICE}/{method}"
        return ((ADMIN_TOKEN_HEADER, self.credential.token(principal="admin", method=path)),)

    def deadline_s(self, *, extra_s: float = 0.0) -> float | None:
        """The timeout for one call, lengthened by `extra_s` for calls that wait on purpose."""
        return None if self.timeout_s is None else self.timeout_s + extra_s

    async def is_serving(self, *, timeout_s: float = 1.0) -> bool:
        try:
            answer = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    async def wait_serving(self, *, timeout_s: float) -> bool:
        """Polls the grpc health service until it says SERVING or `timeout_s` has passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return False
            if await self.is_serving(timeout_s=min(1.0, remaining_s)):
                return True
            await asyncio.sleep(min(health_poll_period_s, max(0.0, deadline - time.monotonic())))

    async def close(self) -> None:
        await self.channel.close(None)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def tls_credentials(*, ca: Path | None, cert: Path | None, key: Path | None
                    ) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting the CA in `ca` (PEM), presenting `cert` with `key` when both
    are given; None when no file is named (plaintext). Raises ValueError for a partial set,
    OSError for a file that cannot be read."""
    if ca is None and cert is None and key is None:
        return None
    if ca is None:
        raise ValueError("--tls-cert and --tls-key need --tls-ca (the CA the node's "
                         "certificate chains to)")
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key is not None else None,
        certificate_chain=cert.read_bytes() if cert is not None else None)


def describe_failure(exc: grpc.RpcError, *, address: str) -> str:
    """One line for stderr, starting with `error: `."""
    err = from_rpc_error(exc)
    if err is not None:
        return error_text(err.reason.name, err.message, err.metadata)
    code: grpc.StatusCode | None = None
    details = ""
    if isinstance(exc, grpc.Call | grpc.aio.AioRpcError):
        code, details = exc.code(), str(exc.details() or "")
    if code == grpc.StatusCode.UNAVAILABLE:
        cause = _connect_cause(details)
        return (
            f"error: cannot reach {address}{cause}; is a node running there? "
            f"(start one with `raftlog node --data DIR --grpc {address}`, or pass --server / "
            f"set {SERVER_ENV}){_tls_hint(details)}"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"error: DEADLINE_EXCEEDED: no answer from {address} in time (see --timeout)"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"error: UNIMPLEMENTED: {address} does not serve this call ({details})"
    name = code.name if code is not None else "UNKNOWN"
    return f"error: {name}: {details or exc}"


def _tls_hint(details: str) -> str:
    """A closed socket or a failed handshake is what a TLS mismatch looks like."""
    lowered = details.lower()
    if any(needle in lowered for needle in ("socket closed", "handshake", "ssl", "tls")):
        return (f"; if the node serves TLS, pass --tls-ca FILE (or set {TLS_CA_ENV}), and "
                "--tls-cert/--tls-key if it requires a client certificate (docs/tls.md)")
    return ""


def _connect_cause(details: str) -> str:
    lowered = details.lower()
    for needle, cause in (
        ("connection refused", "connection refused"),
        ("dns resolution failed", "unknown host"),
        ("timeout", "connection timed out"),
    ):
        if needle in lowered:
            return f" ({cause})"
    return f" ({details})" if details else ""
