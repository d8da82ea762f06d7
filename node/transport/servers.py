"""`aio_server`: the grpc.aio server every listener of a node is built on.

grpcio 1.85's asyncio server takes each incoming call by waiting (`asyncio.wait`, first
completed) on one pending "request call" per *registered* method, and the generated
`add_*Servicer_to_server` functions register every method of their service. A node's client
port serves about 220 methods (every front-end), so each call cost an `asyncio.wait` over 220
futures: a done-callback added to and removed from each, on the event loop, per call. A py-spy
profile of a primary taking batches of 10 found it in 6-7% of the loop's samples, the largest
single item after grpc's own C code (upstream: grpc/grpc pull request 43461, open).

Methods found through their services' generic handlers (which the generated functions add as
well) serve the same calls, with the same interceptors, through one pending request call. So
the server made here ignores method registration; everything else is grpc.aio's own server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc


def _generic_only(service_name: str,
                  method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
    """Registration of a service's methods: left out (their generic handler serves them)."""


def aio_server(*, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
               options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=list(interceptors), options=list(options))
    server.add_registered_method_handlers = _generic_only  # type: ignore[method-assign]
    return server
