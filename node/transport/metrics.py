"""A node's Prometheus endpoint (`raftlog node --metrics HOST:PORT`, docs/metrics.md).

Each node owns one `NodeMetrics`: its own registry (never prometheus_client's global one, so
several nodes can share a process in tests), the few instruments that count on a hot path (a
call through the client port, a forwarded call, a group-commit fsync, a Raft proposal), and
the HTTP listener that serves `/metrics`. The peer listener (node-to-node services) has its
own families (`raftlog_peer_rpc_*`, `raftlog_replica_*`), so that the client-port series keep
counting client calls only. Everything else is read when a scrape arrives, by
metrics_state.StateCollector, from the state the node keeps anyway.

Labels are bounded: a service and method name come from the protos (a fixed set), a reason
from the error catalogue or the gRPC status codes, a stream or consumer name from the
streams and consumers the node holds. No label ever carries a message id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc

# Latency buckets in seconds: a fsynced publish takes a few ms, a long-poll fetch seconds.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0, 30.0)
# Futures one fsync releases (group commit): 1 when idle, more under concurrent writes.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Bytes one fsync makes durable: a small publish writes a few hundred, a batch up to MBs.
BATCH_BYTES_BUCKETS = (256, 1024, 4096, 16_384, 65_536, 262_144, 1_048_576, 4_194_304,
                       16_777_216, 67_108_864)

# The canonical operation a method name stands for, on every front-end that has it.
OPERATIONS = {
    "Publish": "publish", "PublishBatch": "publish", "PublishStream": "publish",
    "PublishFrames": "publish",
    "PublishToTopic": "publish", "Produce": "publish", "SendMessage": "publish",
    "Fetch": "fetch", "ConsumeNAck": "fetch", "ReceiveMessage": "fetch", "PullMessage": "fetch",
    "Ack": "ack", "AckMessage": "ack",
}
CANCELLED = grpc.StatusCode.CANCELLED.name
PEER = "peer"  # the _Ender of a call on the peer listener (no front-end of the client port)
# A service's front-end, by the prefix of its full name (first match wins).
FRONTENDS = (
    ("raftlog.v1.", "raftlog.v1"),
    ("waymaker.", "waymaker"),
    ("KafkaPixy", "kafkapixy"),
    ("apache.rocketmq.v1.", "rocketmq.v1"),
    ("apache.rocketmq.v2.", "rocketmq.v2"),
    ("grpc.", "grpc"),
)


def frontend_of(service: str) -> str:
    """The front-end a gRPC service belongs to ("other" for none of ours)."""
    return next((name for prefix, name in FRONTENDS if service.startswith(prefix)), "other")


def split_method(path: str) -> tuple[str, str]:
    """'/raftlog.v1.Streams/Publish' -> ('raftlog.v1.Streams', 'Publish')."""
    service, _, method = path.lstrip("/").partition("/")
    return service, method


def parse_listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT of the metrics listener (port 0: any free port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise RaftlogError(Reason.INVALID_CONFIG,
                           f"--metrics wants HOST:PORT, not {text!r}", address=text)
    return host.strip("[]"), int(port)


class NodeMetrics:
    """The node's registry and its hot-path instruments. `serve` opens the listener."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu, fds
        reg = self.registry
        self.calls = Counter(
            "raftlog_rpc_calls", "Calls received on the client port, by front-end and method.",
            ["frontend", "service", "method"], registry=reg)
        self.errors = Counter(
            "raftlog_rpc_errors", "Calls on the client port that ended with an error, by the "
            "ErrorInfo reason (or the gRPC status code when the error carried none); a call "
            "its caller cancelled is not counted.",
            ["frontend", "reason"], registry=reg)
        self.operations = Counter(
            "raftlog_operations", "Publish, fetch and ack calls on every front-end, by outcome "
            "(ok, error, cancelled by the caller).",
            ["operation", "frontend", "outcome"], registry=reg)
        self.latency = Histogram(
            "raftlog_operation_duration_seconds", "Time from receiving a publish, fetch or ack "
            "call to its answer (a fetch includes its wait for messages).",
            ["operation", "frontend"], buckets=LATENCY_BUCKETS_S, registry=reg)
        self.forwarded = Counter(
            "raftlog_forwarded_calls", "Calls this node sent on to another node (the stream's "
            "primary or the Raft leader), by method.", ["method"], registry=reg)
        self.commit_batch = Histogram(
            "raftlog_group_commit_batch_size", "Writers one fsync made durable at once.",
            buckets=BATCH_BUCKETS, registry=reg)
        self.commit_bytes = Histogram(
            "raftlog_group_commit_bytes", "Bytes of database writes (messages, their indexes, "
            "stream and consumer state) one fsync made durable.",
            buckets=BATCH_BYTES_BUCKETS, registry=reg)
        self.proposal = Histogram(
            "raftlog_raft_proposal_duration_seconds", "Time from proposing a metadata command "
            "to Raft to its result (committed and applied), failures included.",
            buckets=LATENCY_BUCKETS_S, registry=reg)
        self.peer_calls = Counter(
            "raftlog_peer_rpc_calls", "Calls received on the peer listener (from other nodes), "
            "by service and method; a Replicate call is one per replication link.",
            ["service", "method"], registry=reg)
        self.peer_errors = Counter(
            "raftlog_peer_rpc_errors", "Calls on the peer listener that ended with an error, by "
            "method and reason (as raftlog_rpc_errors); a cancelled call is not counted.",
            ["method", "reason"], registry=reg)
        self.replica_batches = Counter(
            "raftlog_replica_batches", "Replicated batches this node accepted as a replica and "
            "made durable.", registry=reg)
        self.replica_messages = Counter(
            "raftlog_replica_messages", "Messages in the batches counted by "
            "raftlog_replica_batches.", registry=reg)
        self.replica_bytes = Counter(
            "raftlog_replica_bytes", "Bytes of the stored messages in the batches counted by "
            "raftlog_replica_batches.", registry=reg)
        self.replica_refusals = Counter(
            "raftlog_replica_refusals", "Replicated batches this node refused as a replica, by "
            "reason (SEQ_GAP: the primary resends from the replica's position; STALE_EPOCH: a "
            "deposed primary; ...).", ["reason"], registry=reg)
        self._server: WSGIServer | None = None
        self._thread: Thread | None = None
        self.port = 0

    # -- the listener --------------------------------------------------------------------------

    def serve(self, address: str) -> int:
        """Serves /metrics on `address` in a thread of its own; returns the bound port."""
        host, port = parse_listen_address(address)
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise RaftlogError(Reason.INVALID_CONFIG,
                               f"cannot listen on {address} (--metrics): {exc}") from None
        self._server, self._thread = server, thread
        self.port = int(server.server_address[1])
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- hot-path hooks ------------------------------------------------------------------------

    def observe_batch(self, waiters: int, synced_bytes: int) -> None:
        """One fsync of the group commit: the writers it released, the bytes it covered."""
        if waiters:
            self.commit_batch.observe(waiters)
        self.commit_bytes.observe(synced_bytes)

    def observe_proposal(self, seconds: float) -> None:
        self.proposal.observe(seconds)

    def count_forward(self, path: str) -> None:
        self.forwarded.labels(path).inc()

    def observe_replicated(self, messages: int, stored_bytes: int) -> None:
        """One batch accepted and durable on this replica."""
        self.replica_batches.inc()
        self.replica_messages.inc(messages)
        self.replica_bytes.inc(stored_bytes)

    def count_refusal(self, reason: str) -> None:
        self.replica_refusals.labels(reason).inc()

    def peer_ended(self, *, method: str, reason: str) -> None:
        """One call on the peer listener finished ("" succeeded; CANCELLED: not an error)."""
        if reason and reason != CANCELLED:
            self.peer_errors.labels(method, reason).inc()

    def ended(self, *, frontend: str, method: str, started: float, reason: str) -> None:
        """One call on the client port finished; `reason` is "" when it succeeded, CANCELLED
        when the caller went away (the usual end of a subscription: not an error here)."""
        outcome = "ok" if not reason else "cancelled" if reason == CANCELLED else "error"
        if outcome == "error":
            self.errors.labels(frontend, reason).inc()
        operation = OPERATIONS.get(method)
        if operation is not None:
            self.operations.labels(operation, frontend, outcome).inc()
            self.latency.labels(operation, frontend).observe(time.perf_counter() - started)


def _reason(exc: BaseException | None, context: Any) -> str:
    """The ErrorInfo reason a call ended with ("" for success)."""
    recorded = rpc.ended_with.get()
    if recorded:
        return recorded
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return CANCELLED  # the caller went away
    if isinstance(exc, RaftlogError):
        return exc.reason.name
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK:
        return code.name
    if exc is not None and not isinstance(exc, grpc.aio.AbortError):
        return Reason.INTERNAL.name
    return ""


class MetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts every call on the client port, times publish/fetch/ack, and counts errors by
    reason. Outermost, so it sees the calls the other interceptors refuse too. With
    `peer=True` (the peer listener) it counts calls and errors in the raftlog_peer_rpc_*
    families instead and times nothing."""

    def __init__(self, metrics: NodeMetrics, *, peer: bool = False) -> None:
        self._metrics = metrics
        self._peer = peer

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        service, method = split_method(details.method)
        if self._peer:
            self._metrics.peer_calls.labels(service, method).inc()
            frontend = PEER
        else:
            frontend = frontend_of(service)
            self._metrics.calls.labels(frontend, service, method).inc()
        done = _Ender(self._metrics, frontend=frontend, method=method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                done.unary(handler.unary_unary), handler.request_deserializer,
                handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                done.streaming(handler.unary_stream), handler.request_deserializer,
                handler.response_serializer)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                done.unary(handler.stream_unary), handler.request_deserializer,
                handler.response_serializer)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                done.streaming(handler.stream_stream), handler.request_deserializer,
                handler.response_serializer)
        return handler


class _Ender:
    """Wraps a handler's behaviour so that its end is reported to the metrics."""

    def __init__(self, metrics: NodeMetrics, *, frontend: str, method: str) -> None:
        self._metrics = metrics
        self._frontend = frontend
        self._method = method

    def _end(self, started: float, exc: BaseException | None, context: Any) -> None:
        reason = _reason(exc, context)
        if self._frontend == PEER:
            self._metrics.peer_ended(method=self._method, reason=reason)
            return
        self._metrics.ended(frontend=self._frontend, method=self._method, started=started,
                            reason=reason)

    def unary(self, behavior: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(request: Any, context: Any) -> Any:
            rpc.ended_with.set("")
            started = time.perf_counter()
            try:
                result = behavior(request, context)
                answer = await result if hasattr(result, "__await__") else result
            except BaseException as exc:
                self._end(started, exc, context)
                raise
            self._end(started, None, context)
            return answer

        return wrapper

    def streaming(self, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(request: Any, context: Any) -> AsyncIterator[Any]:
            rpc.ended_with.set("")
            started = time.perf_counter()
            try:
                result = behavior(request, context)
                if hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:  # a handler that writes with context.write and returns
                    await result
            except BaseException as exc:
                self._end(started, exc, context)
                raise
            self._end(started, None, context)

        return wrapper
