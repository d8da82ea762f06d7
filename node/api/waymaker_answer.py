"""How a unary Waymaker call answers (waymaker.py and its sibling services): a RaftlogError
becomes `success=false` with the seed's `result_code` (waymaker_codes) and raftlog's message, or
stays a gRPC status where the seed has no code for it; a refused seq of an Ack, Nak, Term or
InProgress becomes the error of the whole call.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.api.waymaker_codes import OK, Family, result_code
from raftlog.node.transport import rpc
from raftlog.v1 import consumers_pb2

Context = grpc.aio.ServicerContext[Any, Any]
Method = Callable[[Any, Any, Context], Awaitable[Any]]


def answered(response: type[Any], family: Family) -> Callable[[Method], Method]:
    """A unary call that answers a RaftlogError as `response(success=False, result_code, ...)`
    (or as its gRPC status, see waymaker_codes); a reply without a result_code leaves with
    success=true and "ok"."""
    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        async def call(self: Any, request: Any, context: Context) -> Any:
            try:
                reply = await method(self, request, context)
            except RaftlogError as err:
                code = result_code(family, err.reason)
                if code is None:
                    raise
                return response(success=False, result_code=code, message=err.message)
            if not reply.result_code:  # a reply that names its own failure keeps it
                reply.success, reply.result_code = True, OK
            return reply
        return rpc.unary(call)
    return wrap


def settled(reply: consumers_pb2.AckResponse) -> None:
    """Raises the error of a refused seq of an Ack/Nak/Term/InProgress."""
    for result in reply.results:
        if result.HasField("error"):
            reason = Reason.__members__.get(result.error.reason, Reason.INTERNAL)
            raise RaftlogError(reason, result.error.message, **dict(result.error.metadata))
