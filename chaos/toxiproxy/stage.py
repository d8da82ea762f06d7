"""What flows through a toxic and the stage a toxic runs in.

A link (one direction of one proxied connection) carries *items*: chunks of bytes, each stamped
with the loop time it reached the proxy, and one final `End` saying how the direction ends. Each
toxic that applies to a link runs in its own `Stage`, reading items from an inbox queue and
emitting items to the next stage's inbox.

A stage may be stopped (its task cancelled) whenever the toxics of its link change, and later
restarted with the same `StageState`. So that no byte is lost or duplicated by a stop, the item a
toxic is working on stays at the head of `backlog` until the toxic has emitted it (`forward`,
`emit_part`) or dropped it (`drop`); `sent_bytes` counts how much of that head has already been
emitted. Queue `get`/`put` are atomic under cancellation, and every method below updates
`backlog` without an `await` between the put and the update.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class EndKind(enum.Enum):
    """How a direction of a connection ends."""

    EOF = "eof"  # the source finished sending: passed on as a half-close (shutdown SHUT_WR)
    CLOSE = "close"  # a toxic or an error ends the whole connection: both sockets closed
    RESET = "reset"  # the whole connection ends with RST on both sockets (SO_LINGER 0)


@dataclass(frozen=True, slots=True)
class Chunk:
    data: bytes
    at_s: float  # loop time the bytes reached the proxy; a latency toxic moves it forward


@dataclass(frozen=True, slots=True)
class End:
    kind: EndKind


Item = Chunk | End


@dataclass(slots=True)
class StageState:
    """What one toxic remembers about one link, kept across stops and restarts of its stage.

    `applies` is the toxicity draw, made when the toxic attaches to the link and again when the
    toxic is updated; a toxic that does not apply gets no stage at all.
    """

    applies: bool
    attached_at_s: float  # loop time of the attach (or of the last update): timeout counts from it
    bytes_passed: int = 0  # limit_data: bytes let through so far
    free_at_s: float = 0.0  # bandwidth: loop time the bytes emitted so far have "finished sending"
    due_s: float | None = None  # loop time a pending delayed action fires (reset, close, piece)


class Stage:
    """Where one toxic runs for one link: an inbox, a backlog, the next inbox, and its state."""

    def __init__(self, *, inbox: asyncio.Queue[Item], outbox: asyncio.Queue[Item],
                 state: StageState, clock: Callable[[], float], rng: random.Random) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.state = state
        self.backlog: deque[Item] = deque()  # items to handle before the inbox; head = current
        self.sent_bytes = 0  # bytes of the head chunk already emitted
        self.rng = rng
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    async def sleep_until(self, when_s: float) -> None:
        delay_s = when_s - self._clock()
        if delay_s > 0:
            await asyncio.sleep(delay_s)

    async def take(self) -> Item:
        """The current item: the head of the backlog, else the next item of the inbox. Without
        the bytes already emitted from it."""
        if not self.backlog:
            self.backlog.append(await self.inbox.get())
        head = self.backlog[0]
        if isinstance(head, Chunk) and self.sent_bytes:
            return Chunk(head.data[self.sent_bytes:], head.at_s)
        return head

    async def forward(self, item: Item) -> None:
        """Emit `item` in place of (what is left of) the current item, and move past it."""
        await self.outbox.put(item)
        self.backlog.popleft()
        self.sent_bytes = 0

    async def emit_part(self, size_bytes: int, *, at_s: float) -> None:
        """Emit the next `size_bytes` of the current chunk; move past it once all is emitted."""
        head = self.backlog[0]
        if not isinstance(head, Chunk):
            raise TypeError("emit_part needs a chunk at the head of the backlog")
        start = self.sent_bytes
        await self.outbox.put(Chunk(head.data[start:start + size_bytes], at_s))
        self.sent_bytes = start + size_bytes
        if self.sent_bytes >= len(head.data):
            self.backlog.popleft()
            self.sent_bytes = 0

    async def inject(self, item: Item) -> None:
        """Emit `item` and keep the current item (if any) where it is."""
        await self.outbox.put(item)

    def drop(self) -> None:
        """Move past the current item without emitting it."""
        self.backlog.popleft()
        self.sent_bytes = 0

    def unsent(self) -> list[Item]:
        """The items this stage holds, oldest first, the head without its emitted bytes; used
        when the stage has been stopped for good."""
        items = list(self.backlog)
        if items and self.sent_bytes:
            head = items[0]
            if isinstance(head, Chunk):
                items[0] = Chunk(head.data[self.sent_bytes:], head.at_s)
        while not self.inbox.empty():
            items.append(self.inbox.get_nowait())
        return items
