"""A Toxiproxy (Shopify Toxiproxy v2 REST API) in asyncio, for chaos runs on machines without
the `toxiproxy-server` binary, and the launcher that prefers the binary when it is on PATH.

Layout, one concept per module:
- stage.py: the items a link carries and the stage a toxic runs in
- toxics.py: the seven toxics (latency, bandwidth, slow_close, timeout, reset_peer, slicer,
  limit_data)
- link.py: one direction of one connection; re-plans data in flight when toxics change
- connection.py: a client and its upstream; half-close, close, reset
- proxy.py: a listener, its connections, its toxics
- model.py: errors, JSON shapes, request validation
- api.py: the REST operations and their rules
- server.py: HTTP/1.1 on asyncio streams, routes
- launch.py: start a server in a subprocess (binary or bundled)
"""

from __future__ import annotations

from .launch import ToxiproxyProcess, start_toxiproxy
from .server import ApiServer, start_server

__all__ = ["ApiServer", "ToxiproxyProcess", "start_server", "start_toxiproxy"]
