"""Turning catalogued errors into gRPC statuses (with google.rpc.ErrorInfo) and back.

Servicer methods are wrapped with `@unary` / `@server_stream` / `@client_stream`: a
RaftlogError becomes its status, code and ErrorInfo; anything else becomes INTERNAL and is
logged with its traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from raftlog.base.errors import ERROR_DOMAIN, RaftlogError, Reason
from raftlog.v1 import types_pb2

log = logging.getLogger(__name__)

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
        await context.abort_with_status(to_status(exc))
    log.exception("internal error", exc_info=exc)
    await context.abort_with_status(
        to_status(RaftlogError(Reason.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"))
    )


def unary(
    method: Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
        try:
            return await method(self, request, context)
        except (RaftlogError, Exception) as exc:
            if isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
                raise
            await abort(context, exc)
            raise  # unreachable: abort raises

    return wrapper


def server_stream(
    method: Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]],
) -> Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Resp]]:
    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Req, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Resp]:
        try:
            async for item in method(self, request, context):
                yield item
        except (RaftlogError, Exception) as exc:
            if isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
                raise
            await abort(context, exc)

    return wrapper
