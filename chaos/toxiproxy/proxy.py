"""A proxy: a listening socket, the connections it accepted, and the toxics of each direction.

Enabled means listening. Each accepted client gets a fresh connection to the upstream; if that
fails the client is closed. Disabling stops listening and drops every connection (Toxiproxy
does the same). Changing a direction's toxics re-plans every live connection of that direction
before the change returns (link.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Sequence

from .connection import Connection
from .link import Clock, read_bytes_max
from .model import Stream, ToxicSpec, join_address, split_address

upstream_connect_s_max = 10.0  # dialling the upstream for one client
listener_close_s_max = 5.0  # waiting for a closed listener to let go of its socket
listen_backlog_connections = 128


class Proxy:
    """One named proxy: listen → upstream, with toxics per direction."""

    def __init__(self, *, name: str, listen: str, upstream: str, clock: Clock,
                 rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.chains: dict[Stream, list[ToxicSpec]] = {stream: [] for stream in Stream}
        self._clock = clock
        self._rng = rng
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()

    @property
    def enabled(self) -> bool:
        return self._server is not None

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def toxics(self) -> list[ToxicSpec]:
        """Every toxic, upstream ones first, each direction in the order they were added."""
        return [*self.chains[Stream.UPSTREAM], *self.chains[Stream.DOWNSTREAM]]

    def find_toxic(self, name: str) -> ToxicSpec | None:
        return next((spec for spec in self.toxics() if spec.name == name), None)

    async def start(self) -> None:
        """Listen on `listen` (then holding the address actually bound). Raises OSError."""
        if self._server is not None:
            return
        host, port = split_address(self.listen)
        sock = await _bind(host, port)
        try:
            self._server = await asyncio.start_server(self._accept, sock=sock,
                                                      limit=read_bytes_max)
        except BaseException:
            sock.close()
            raise
        bound_host, bound_port = sock.getsockname()[:2]
        self.listen = join_address(bound_host, bound_port)

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self._connections):
            connection.drop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), listener_close_s_max)

    async def differs(self, *, listen: str, upstream: str) -> bool:
        """Whether `listen` (resolved) or `upstream` differ from this proxy's."""
        if upstream != self.upstream:
            return True
        host, port = split_address(listen)
        try:
            address = await _resolve(host, port)
        except OSError:
            return True
        return join_address(*address) != self.listen

    async def set_chain(self, stream: Stream, chain: Sequence[ToxicSpec]) -> None:
        self.chains[stream] = list(chain)
        await asyncio.gather(*(connection.reconfigure(stream, self.chains[stream])
                               for connection in list(self._connections)))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server = self._server
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=read_bytes_max),
                upstream_connect_s_max)
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        if server is None or self._server is not server:  # disabled while dialling
            writer.transport.abort()
            upstream[1].transport.abort()
            return
        connection = Connection(client=(reader, writer), upstream=upstream,
                                on_closed=self._connections.discard, clock=self._clock,
                                rng=self._rng)
        self._connections.add(connection)
        connection.start(self.chains)


async def _resolve(host: str, port: int) -> tuple[str, int]:
    """The address a listener for host:port binds: the first IPv4 one if any."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    address = infos[0][4]
    return str(address[0]), int(address[1])


async def _bind(host: str, port: int) -> socket.socket:
    bind_host, bind_port = await _resolve(host, port)
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, bind_port))
        sock.listen(listen_backlog_connections)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
