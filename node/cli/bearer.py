"""The CLI's user token (docs/auth.md): `--token` or $RAFTLOG_TOKEN, sent on every call as
`authorization: Bearer <token>` by a client interceptor on the channel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

TOKEN_ENV = "RAFTLOG_TOKEN"


def _with_token(details: Any, token: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()),
                                 ("authorization", f"Bearer {token}"))
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                      details.credentials, details.wait_for_ready)


class _Bearer(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
              grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                                    request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)

    async def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any,
                                     request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)

    async def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any,
                                     requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)

    async def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any,
                                      requests: Any) -> Any:
        return await continuation(_with_token(details, self._token), requests)


def interceptors(token: str | None) -> list[Any] | None:
    """The channel interceptors that send `token` (None without one)."""
    return [_Bearer(token)] if token else None
