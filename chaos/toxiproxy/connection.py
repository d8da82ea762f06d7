"""One proxied connection: the client's socket, the upstream socket, and the two links between
them (upstream: client → server, downstream: server → client). Owns how the connection ends:

- a link that ends with EOF half-closes its destination (shutdown SHUT_WR) and the other
  direction goes on; when both directions have ended, both sockets close;
- CLOSE (a toxic such as limit_data or timeout, or a socket error) closes both sockets after
  flushing what was already written to them (bounded by `close_flush_s_max`);
- RESET (reset_peer) closes both sockets with SO_LINGER 0, so each peer gets an RST;
- `drop()` (proxy disabled or deleted) closes both sockets at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import Callable, Mapping, Sequence

from .link import Clock, Link
from .model import Stream, ToxicSpec
from .stage import EndKind

close_flush_s_max = 5.0  # a closing socket may take this long to flush, then it is aborted
linger_rst = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class Connection:
    """A client and its upstream, joined by two links that follow the proxy's toxics."""

    def __init__(self, *, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 on_closed: Callable[[Connection], None], clock: Clock,
                 rng: random.Random) -> None:
        self._writers = (client[1], upstream[1])
        self._on_closed = on_closed
        self.closed = False
        self.links = {
            Stream.UPSTREAM: Link(source=client[0], dest=upstream[1], on_end=self._link_ended,
                                  clock=clock, rng=rng),
            Stream.DOWNSTREAM: Link(source=upstream[0], dest=client[1],
                                    on_end=self._link_ended, clock=clock, rng=rng),
        }

    def start(self, chains: Mapping[Stream, Sequence[ToxicSpec]]) -> None:
        for writer in self._writers:
            _set_nodelay(writer)
        for stream, link in self.links.items():
            link.start(chains[stream])

    async def reconfigure(self, stream: Stream, chain: Sequence[ToxicSpec]) -> None:
        await self.links[stream].reconfigure(chain)

    def drop(self) -> None:
        """Close both sockets now, discarding anything not yet written."""
        if self._finish():
            for writer in self._writers:
                writer.transport.abort()

    def _link_ended(self, link: Link, kind: EndKind) -> None:
        if kind is EndKind.EOF:
            _write_eof(link.dest)
            if all(other.finished for other in self.links.values()):
                self._close()
        elif kind is EndKind.RESET:
            self._reset()
        else:
            self._close()

    def _close(self) -> None:
        if self._finish():
            loop = asyncio.get_running_loop()
            for writer in self._writers:
                writer.close()
                loop.call_later(close_flush_s_max, writer.transport.abort)

    def _reset(self) -> None:
        if self._finish():
            for writer in self._writers:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_rst)
                writer.transport.abort()

    def _finish(self) -> bool:
        """Stop both links; False when the connection had already finished."""
        if self.closed:
            return False
        self.closed = True
        for link in self.links.values():
            link.stop()
        self._on_closed(self)
        return True


def _set_nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _write_eof(writer: asyncio.StreamWriter) -> None:
    try:
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
    except OSError:
        pass
