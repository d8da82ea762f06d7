"""Request bytes that do not parse: every method of a gRPC server answers them with
INVALID_ARGUMENT / MALFORMED_REQUEST (the ErrorInfo every raftlog error carries) and one
rate-limitable warning line, never gRPC's UNKNOWN with a traceback per call.

grpc.aio runs a method's `request_deserializer` itself (before a unary handler starts, and inside
the request iterator of a streaming one) and logs whatever it raises with a traceback. The
interceptor here wraps every handler: its deserializer returns a `MalformedRequest` marker
instead of raising, and its behaviour ends the call when it meets one: for a unary request
before the servicer (or any handler further in) runs, for a streamed request when the servicer
reaches the bad frame. Frames before it were read as usual; nothing after it is.

A streamed request may be read by a task of the servicer's own (PublishFrames' reader, the
Replicate and Telemetry readers) while the handler task writes answers on the same call. The
error status is then never sent from that task: sending it beside a message in flight lost the
status now and then, and the client waited for its deadline. The reader notes the bad frame
and stops with MalformedFrameError; the call is refused in the handler task, once the servicer
lets that error through or ends, whichever comes first.

Install it on any grpc.aio server, outside every other interceptor that reads the request,
i.e. first in the list:

    grpc.aio.server(interceptors=[MalformedRequestInterceptor(), *others])

A sync behaviour for a unary request (a generated base class's "not implemented" method, such as
Health.List) is guarded too and run in the executor; one for a streamed request, or a handler
with no deserializer (raw bytes), is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """What the guarded deserializer returns for bytes its method cannot parse."""

    size_bytes: int
    problem: str


def tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`deserialize`, returning a MalformedRequest where it would raise."""

    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # any failure to parse is the fault of the caller's bytes
            problem = f"{type(exc).__name__}: {exc}"[:limits.malformed_error_chars_max]
            return MalformedRequest(size_bytes=len(raw), problem=problem)

    return parse


async def refuse(context: Context, method: str, bad: MalformedRequest) -> None:
    """Ends the call with INVALID_ARGUMENT / MALFORMED_REQUEST (raises AbortError)."""
    log.warning("malformed request to %s from %s (%d bytes): %s", method, context.peer(),
                bad.size_bytes, bad.problem)
    await rpc.abort(context, RaftlogError(
        Reason.MALFORMED_REQUEST, f"the request to {method} does not parse: {bad.problem}",
        method=method, size=bad.size_bytes))


def _unary_request(method: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):
        async def stream_out(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, MalformedRequest):
                await refuse(context, method, request)
            async with contextlib.aclosing(behaviour(request, context)) as responses:
                async for response in responses:
                    yield response
        return stream_out

    async def unary_out(request: Any, context: Context) -> Any:
        if isinstance(request, MalformedRequest):
            await refuse(context, method, request)
        return await behaviour(request, context)
    return unary_out


class MalformedFrameError(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised to a task other than the handler's that read a bad frame: the call is refused
    in the handler task. An AbortError, so that every layer lets it through as it would a
    call already ended."""

    def __init__(self, bad: MalformedRequest) -> None:
        super().__init__(bad.problem)
        self.bad = bad


@dataclass(slots=True)
class _StreamedCall:
    """One call with a streamed request: whom to refuse, from which task, and the bad frame
    a task other than the handler's met."""

    method: str
    context: Context
    handler: asyncio.Task[Any] | None
    bad: MalformedRequest | None = None

    async def checked(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, MalformedRequest):
                if asyncio.current_task() is self.handler:
                    await refuse(self.context, self.method, request)
                self.bad = request
                raise MalformedFrameError(request)
            yield request

    async def refuse_noted(self) -> None:
        """Refuses the call if a reader met a bad frame (raises AbortError)."""
        if self.bad is not None:
            await refuse(self.context, self.method, self.bad)


def _streamed_request(method: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behaviour):
        async def stream_out(requests: AsyncIterator[Any], context: Context
                             ) -> AsyncIterator[Any]:
            call = _StreamedCall(method, context, asyncio.current_task())
            with contextlib.suppress(MalformedFrameError):  # refused just below
                async with contextlib.aclosing(
                        behaviour(call.checked(requests), context)) as responses:
                    async for response in responses:
                        yield response  # answers to frames before a bad one may go out
            await call.refuse_noted()
        return stream_out

    async def unary_out(requests: AsyncIterator[Any], context: Context) -> Any:
        call = _StreamedCall(method, context, asyncio.current_task())
        answer = None
        with contextlib.suppress(MalformedFrameError):  # refused just below
            answer = await behaviour(call.checked(requests), context)
        await call.refuse_noted()
        return answer
    return unary_out


def _sync_unary_request(method: str, behaviour: Callable[..., Any], *, streaming: bool
                        ) -> Callable[..., Any]:
    """A sync behaviour (such as a generated base class's "not implemented" method) behind the
    same check, run in the loop's executor as grpc.aio would run it. Its NotImplementedError
    becomes UNIMPLEMENTED without a traceback."""
    async def run(request: Any, context: Context) -> Any:
        if isinstance(request, MalformedRequest):
            await refuse(context, method, request)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, behaviour, request, context)
        except NotImplementedError as exc:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc) or "not implemented")

    if not streaming:
        return run

    async def stream_out(request: Any, context: Context) -> AsyncIterator[Any]:
        responses = iter(await run(request, context))
        loop, done = asyncio.get_running_loop(), object()
        while (response := await loop.run_in_executor(None, next, responses, done)) is not done:
            yield response
    return stream_out


def _is_async(behaviour: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)


def guard_handler(handler: Any, method: str) -> Any:
    """`handler` (a grpc RpcMethodHandler) answering unparseable bytes with MALFORMED_REQUEST;
    `handler` itself when it has no deserializer, or a sync behaviour for a streamed request."""
    if handler is None or handler.request_deserializer is None:
        return handler
    shapes: tuple[tuple[Any, Callable[..., Any], Callable[..., Any]], ...] = (
        (handler.unary_unary, grpc.unary_unary_rpc_method_handler, _unary_request),
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler, _unary_request),
        (handler.stream_unary, grpc.stream_unary_rpc_method_handler, _streamed_request),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler, _streamed_request),
    )
    for behaviour, make, wrap in shapes:
        if behaviour is None:
            continue
        if _is_async(behaviour):
            guarded = wrap(method, behaviour)
        elif not handler.request_streaming:
            guarded = _sync_unary_request(method, behaviour,
                                          streaming=handler.response_streaming)
        else:
            return handler
        return make(guarded, request_deserializer=tolerant(handler.request_deserializer),
                    response_serializer=handler.response_serializer)
    return handler


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Guards every method of the server it is installed on (see the module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        return guard_handler(handler, details.method)  # type: ignore[attr-defined]
