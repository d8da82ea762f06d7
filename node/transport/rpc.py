"""Turning catalogued errors into gRPC statuses (with google.rpc.ErrorInfo) and back.

Servicer methods are wrapped with `@unary` / `@server_stream` / `@client_stream`: a
RaftlogError becomes its status, code and ErrorInfo; anything else becomes INTERNAL and is
logged with its traceback. The wrappers also give every call its request id and log fields for
as long as it runs (logctx.py), return the id to the caller in the trailing metadata, and log
at DEBUG how each call ended, on the logger `raftlog.calls.<Service>.<Method>` (one logger per
method, so the repeat limiter of log_limit.py caps the lines of each method separately).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from raftlog.base.errors import ERROR_DOMAIN, RaftlogError, Reason
from raftlog.node.transport import logctx
from raftlog.v1 import types_pb2

log = logging.getLogger(__name__)
CALLS_LOGGER = "raftlog.calls"

# The ErrorInfo reason the current call was aborted with ("" while none), for the metrics
# interceptor (metrics.py), which reads it in the same task once the handler has returned.
ended_with: ContextVar[str] = ContextVar("raftlog_rpc_ended_with", default="")

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def grpc_status(reason: Reason) -> grpc.StatusCode:
    """The gRPC status code of a catalogued reason."""
    return grpc.StatusCode[reason.status_name]


def to_status(err: RaftlogError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(
        reason=err.reason.name, domain=ERROR_DOMAIN, metadata=err.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(
        code=getattr(code_pb2, err.status_name), message=err.message, details=[detail]
    )
    return rpc_status.to_status(status)


def to_error_pb(err: RaftlogError) -> types_pb2.Error:
    return types_pb2.Error(
        code=getattr(code_pb2, err.status_name),
        reason=err.reason.name,
        message=err.message,
        metadata=err.metadata,
    )


def from_rpc_error(exc: grpc.RpcError) -> RaftlogError | None:
    """The RaftlogError a raftlog server sent, or None when the failure carries no ErrorInfo."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == ERROR_DOMAIN:
            try:
                reason = Reason[info.reason]
            except KeyError:
                return None
            return RaftlogError(reason, status.message, **dict(info.metadata))
    return None


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    """Ends the call with the exception's status (INTERNAL, logged, for a non-RaftlogError)."""
    if isinstance(exc, RaftlogError):
        ended_with.set(exc.reason.name)
        await context.abort_with_status(_with_request_id(to_status(exc)))
    ended_with.set(Reason.INTERNAL.name)
    log.exception("internal error", exc_info=exc)
    await context.abort_with_status(_with_request_id(
        to_status(RaftlogError(Reason.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"))
    ))


def _with_request_id(status: Any) -> Any:
    """`status` (rpc_status's namedtuple) with the call's request id in its trailing metadata:
    an abort replaces the trailers set at the start of the call."""
    request_id = logctx.request_id()
    if request_id is None:
        return status
    return status._replace(trailing_metadata=(
        *status.trailing_metadata, (logctx.REQUEST_ID_HEADER, request_id)))


@dataclass
class _Scope:
    """One servicer call's log fields and how it ended (CANCELLED until it says otherwise)."""

    name: str
    calls_log: logging.Logger
    token: Any = None
    started_s: float = 0.0
    outcome: str = "CANCELLED"

    def enter(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Sets the call's log fields and returns its request id to the caller in the
        trailing metadata. A context without gRPC metadata (the simulator's, chaos/sim) gets
        a new id and no trailers."""
        metadata = getattr(context, "invocation_metadata", None)
        request_id = logctx.incoming_request_id(metadata() if metadata is not None else ())
        set_trailers = getattr(context, "set_trailing_metadata", None)
        if set_trailers is not None:
            set_trailers(((logctx.REQUEST_ID_HEADER, request_id),))
        self.token = logctx.enter(request_id=request_id, method=self.name,
                                  **logctx.request_fields(request))
        self.started_s = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, RaftlogError):
            self.outcome = exc.reason.name
        elif isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
            self.outcome = "ABORTED"
        else:
            self.outcome = f"INTERNAL ({type(exc).__name__})"

    def leave(self) -> None:
        if self.calls_log.isEnabledFor(logging.DEBUG):
            self.calls_log.debug("%s ended %s after %.1f ms", self.name, self.outcome,
                                 (time.monotonic() - self.started_s) * 1000)
        logctx.leave(self.token)


def unary(
    method: Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
    name = method.__qualname__
    calls_log = logging.getLogger(f"{CALLS_LOGGER}.{name}")

    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
        scope = _Scope(name, calls_log)
        scope.enter(request, context)
        try:
            answer = await method(self, request, context)
            scope.outcome = "OK"
            return answer
        except (RaftlogError, Exception) as exc:
            scope.failed(exc)
            if isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
                raise
            await abort(context, exc)
            raise  # unreachable: abort raises
        finally:
            scope.leave()

    return wrapper


def server_stream(
    method: Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]]:
    name = method.__qualname__
    calls_log = logging.getLogger(f"{CALLS_LOGGER}.{name}")

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Resp]:
        scope = _Scope(name, calls_log)
        scope.enter(request, context)
        try:
            async for item in method(self, request, context):
                yield item
            scope.outcome = "OK"
        except (RaftlogError, Exception) as exc:
            scope.failed(exc)
            if isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
                raise
            await abort(context, exc)
        finally:
            scope.leave()

    return wrapper
