"""One direction of one proxied connection: read from a source socket, pass the bytes through
the toxics that apply to this connection, write them to the destination socket.

With no toxic applying, the link is one task that reads up to `read_bytes_max`, writes and
drains (no queue, no per-chunk allocation beyond the read). With toxics it is a pipeline: a
reader task, one task per toxic (stage.py), a writer task, joined by bounded queues.

When the toxics of a direction change, every link of that direction is re-planned while data is
in flight: all its tasks are stopped, every item they hold is collected in stream order with the
position it had reached in the chain, the new chain is built, and each item is put back in front
of the first toxic of the new chain it has not yet passed (`replan`). Nothing is lost or sent
twice; a toxic added to a connection acts on all data that has not yet left the proxy.

How a link ends is its owner's business: the link reports its `End` through `on_end`.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from .model import ToxicSpec
from .stage import Chunk, End, EndKind, Item, Stage, StageState

read_bytes_max = 64 * 1024  # one read from a socket
writer_inbox_items_max = 16  # items queued ahead of the writer of a pipeline

Clock = Callable[[], float]


def replan(items: Sequence[tuple[int, Item]], *, old_names: Sequence[str],
           new_names: Sequence[str], closing: Mapping[str, EndKind]) -> list[tuple[int, Item]]:
    """Where the items in flight go when a link's chain changes from `old_names` to `new_names`.

    `items` are (position, item), oldest first, where position k means "about to enter (or
    held by) old toxic k" and len(old_names) means "about to be written". An item goes in front
    of the first toxic of old_names[k:] that is still in the chain; if none is, it is written
    without passing toxics added at the end (they were not there when it passed). A removed
    toxic in `closing` ends the link where it stood: the items that had not yet passed it are
    replaced by one End of that kind.
    """
    new_index = {name: index for index, name in enumerate(new_names)}
    moved = []
    for position in range(len(old_names) + 1):
        survivors = [new_index[name] for name in old_names[position:] if name in new_index]
        moved.append(survivors[0] if survivors else len(new_names))
    cut = max((index for index, name in enumerate(old_names) if name in closing), default=None)
    planned = [(moved[position], item) for position, item in items
               if cut is None or position > cut]
    if cut is not None:
        planned.append((moved[cut], End(closing[old_names[cut]])))
    return planned


def _same_specs(left: Sequence[ToxicSpec], right: Sequence[ToxicSpec]) -> bool:
    return len(left) == len(right) and all(a is b for a, b in zip(left, right, strict=True))


class Link:
    """Source → toxics that apply → destination, for one direction of one connection."""

    def __init__(self, *, source: asyncio.StreamReader, dest: asyncio.StreamWriter,
                 on_end: Callable[[Link, EndKind], None], clock: Clock,
                 rng: random.Random) -> None:
        self.source = source
        self.dest = dest
        self.finished = False  # the link's End has been handled (or its connection closed)
        self._on_end = on_end
        self._clock = clock
        self._rng = rng
        self._specs: dict[str, ToxicSpec] = {}  # every toxic attached, applying or not
        self._states: dict[str, StageState] = {}
        self._chain: list[ToxicSpec] = []  # the toxics that apply, in order
        self._stages: list[Stage] = []
        self._writer_inbox: asyncio.Queue[Item] = asyncio.Queue(writer_inbox_items_max)
        self._writer_backlog: deque[Item] = deque()
        self._pending: Item | None = None  # read by the reader, not yet queued
        self._reader_done = False
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()

    def start(self, chain: Sequence[ToxicSpec]) -> None:
        self._attach(chain)
        self._build([])

    async def reconfigure(self, chain: Sequence[ToxicSpec]) -> None:
        """Make the link follow `chain` (every toxic of its direction, in order)."""
        async with self._lock:
            if self.finished:
                return
            old_chain = list(self._chain)
            closing = self._attach(chain)
            if not closing and _same_specs(self._chain, old_chain):
                return
            await self._halt()
            if self.finished:
                return
            items = self._collect()
            self._build(replan(items, old_names=[spec.name for spec in old_chain],
                               new_names=[spec.name for spec in self._chain], closing=closing))

    def stop(self) -> None:
        """End the link now, dropping what it holds (its connection is closing)."""
        self.finished = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    def _attach(self, chain: Sequence[ToxicSpec]) -> dict[str, EndKind]:
        """Update the per-toxic states for `chain`; return the removed toxics that end the
        link (by name, with how)."""
        now_s = self._clock()
        wanted = {spec.name: spec for spec in chain}
        closing = {}
        for name, old in self._specs.items():
            kind = old.toxic.end_on_removal()
            if name not in wanted and self._states[name].applies and kind is not None:
                closing[name] = kind
        states = {}
        for spec in chain:
            state = self._states.get(spec.name)
            if state is None:
                state = StageState(applies=self._roll(spec.toxicity), attached_at_s=now_s)
            elif self._specs[spec.name] is not spec:  # updated: draw again, restart its clock
                state.applies = self._roll(spec.toxicity)
                state.attached_at_s, state.due_s = now_s, None
            states[spec.name] = state
        self._specs, self._states = wanted, states
        self._chain = [spec for spec in chain if states[spec.name].applies]
        return closing

    def _roll(self, toxicity: float) -> bool:
        return self._rng.random() < toxicity

    async def _halt(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _collect(self) -> list[tuple[int, Item]]:
        """Every item the stopped pipeline holds, oldest first, with its chain position."""
        depth = len(self._stages)
        items = [(depth, item) for item in self._writer_backlog]
        while not self._writer_inbox.empty():
            items.append((depth, self._writer_inbox.get_nowait()))
        for position in range(depth - 1, -1, -1):
            items.extend((position, item) for item in self._stages[position].unsent())
        if self._pending is not None:
            items.append((0, self._pending))
            self._pending = None
        return items

    def _build(self, planned: Sequence[tuple[int, Item]]) -> None:
        """Stages for the current chain, filled with `planned`, and their tasks started."""
        inboxes: list[asyncio.Queue[Item]] = [
            asyncio.Queue(spec.toxic.inbox_items_max) for spec in self._chain]
        self._writer_inbox = asyncio.Queue(writer_inbox_items_max)
        outboxes = [*inboxes[1:], self._writer_inbox][:len(inboxes)]
        self._stages = [
            Stage(inbox=inbox, outbox=outbox, state=self._states[spec.name],
                  clock=self._clock, rng=self._rng)
            for spec, inbox, outbox in zip(self._chain, inboxes, outboxes, strict=True)]
        self._writer_backlog = deque()
        for position, item in planned:
            if position < len(self._stages):
                self._stages[position].backlog.append(item)
            else:
                self._writer_backlog.append(item)
        if not self._stages:
            self._start_direct()
            return
        for spec, stage in zip(self._chain, self._stages, strict=True):
            self._spawn(spec.toxic.pipe(stage))
        self._spawn(self._write_from_pipeline())
        if not self._reader_done:
            self._spawn(self._read_into_pipeline(inboxes[0]))

    def _start_direct(self) -> None:
        for item in self._writer_backlog:
            if isinstance(item, End):
                self._end(item.kind)
                return
            self.dest.write(item.data)
        self._writer_backlog.clear()
        if not self._reader_done:
            self._spawn(self._pump())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work))

    def _end(self, kind: EndKind) -> None:
        if self.finished:
            return
        self.stop()
        self._on_end(self, kind)

    async def _read(self) -> Item:
        try:
            data = await self.source.read(read_bytes_max)
        except OSError:
            return End(EndKind.CLOSE)
        return Chunk(data, self._clock()) if data else End(EndKind.EOF)

    async def _pump(self) -> None:
        """The link without toxics: read, write, drain."""
        source, dest = self.source, self.dest
        while True:
            try:
                data = await source.read(read_bytes_max)
            except OSError:
                self._reader_done = True
                self._end(EndKind.CLOSE)
                return
            if not data:
                self._reader_done = True
                self._end(EndKind.EOF)
                return
            dest.write(data)
            try:
                await dest.drain()
            except OSError:
                self._end(EndKind.CLOSE)
                return

    async def _read_into_pipeline(self, inbox: asyncio.Queue[Item]) -> None:
        while True:
            if self._pending is None:
                self._pending = await self._read()
            await inbox.put(self._pending)
            item, self._pending = self._pending, None
            if isinstance(item, End):
                self._reader_done = True
                return

    async def _write_from_pipeline(self) -> None:
        while True:
            if self._writer_backlog:
                item = self._writer_backlog.popleft()
            else:
                item = await self._writer_inbox.get()
            if isinstance(item, End):
                self._end(item.kind)
                return
            self.dest.write(item.data)
            try:
                await self.dest.drain()
            except OSError:
                self._end(EndKind.CLOSE)
                return
