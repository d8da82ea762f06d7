"""The toxics: their attributes (as Toxiproxy names and defaults them) and what each does to the
items of one link.

Each toxic is an immutable value built from the JSON `attributes` object; `pipe(stage)` runs it
on one link until it has passed the link's `End` on (or ended the link itself). The stage keeps
whatever must survive a restart (see stage.py), so `pipe` may be cancelled at any `await` and
started again with the same stage.

Units are Toxiproxy's: times in milliseconds (the slicer's delay in microseconds), rates in
KB/s (1 KB = 1000 bytes), sizes in bytes.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import random
from typing import ClassVar

from .stage import Chunk, End, EndKind, Stage

attribute_value_max = 2**53 - 1  # the largest integer a JSON number carries exactly
stage_inbox_items_max = 4  # items queued ahead of a toxic (Toxiproxy: unbuffered channels)
latency_inbox_items_max = 1024  # a latency toxic holds this many chunks in flight (as Toxiproxy)
bandwidth_piece_ms = 100  # a bandwidth toxic sends a large chunk in pieces of this much time
ms_per_s = 1000.0
us_per_s = 1_000_000.0
bytes_per_kb = 1000


class ToxicAttributeError(ValueError):
    """An attributes object a toxic type cannot take."""


@dataclasses.dataclass(frozen=True)
class Toxic(abc.ABC):
    """A toxic type: integer attributes (all default 0) and its effect on a link."""

    type_name: ClassVar[str]
    inbox_items_max: ClassVar[int] = stage_inbox_items_max

    def attributes(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def check(self) -> None:  # noqa: B027 -- most toxics take any attribute values
        """Raise ToxicAttributeError when the attributes cannot work together."""

    @abc.abstractmethod
    async def pipe(self, stage: Stage) -> None:
        """Pass the link's items on, changed as this toxic changes them, until the end."""

    def end_on_removal(self) -> EndKind | None:
        """How a link this toxic applied to ends when the toxic is removed; None: it goes on."""
        return None


@dataclasses.dataclass(frozen=True)
class Latency(Toxic):
    """Delays every chunk by latency ± jitter ms after it reached the proxy."""

    type_name: ClassVar[str] = "latency"
    inbox_items_max: ClassVar[int] = latency_inbox_items_max
    latency: int = 0  # ms
    jitter: int = 0  # ms

    def delay_s(self, rng: random.Random) -> float:
        delay_ms = self.latency
        if self.jitter > 0:
            delay_ms += rng.randrange(2 * self.jitter) - self.jitter
        return delay_ms / ms_per_s

    async def pipe(self, stage: Stage) -> None:
        while True:
            item = await stage.take()
            if isinstance(item, End):
                await stage.forward(item)
                return
            due_s = item.at_s + self.delay_s(stage.rng)
            await stage.sleep_until(due_s)
            await stage.forward(Chunk(item.data, due_s))


@dataclasses.dataclass(frozen=True)
class Bandwidth(Toxic):
    """Lets bytes through at `rate` KB/s; 0 means no limit."""

    type_name: ClassVar[str] = "bandwidth"
    rate: int = 0  # KB/s

    async def pipe(self, stage: Stage) -> None:
        state = stage.state
        while True:
            item = await stage.take()
            if isinstance(item, End):
                await stage.forward(item)
                return
            if self.rate <= 0:
                await stage.forward(item)
                continue
            size_bytes = min(len(item.data), self.rate * bandwidth_piece_ms)
            if state.due_s is None:
                send_s = size_bytes / (self.rate * bytes_per_kb)
                state.due_s = max(stage.now(), state.free_at_s) + send_s
            await stage.sleep_until(state.due_s)
            due_s = state.due_s
            await stage.emit_part(size_bytes, at_s=item.at_s)
            state.free_at_s, state.due_s = due_s, None


@dataclasses.dataclass(frozen=True)
class SlowClose(Toxic):
    """Holds the end of the stream back for `delay` ms; data passes untouched."""

    type_name: ClassVar[str] = "slow_close"
    delay: int = 0  # ms

    async def pipe(self, stage: Stage) -> None:
        while True:
            item = await stage.take()
            if isinstance(item, Chunk):
                await stage.forward(item)
                continue
            if stage.state.due_s is None:
                stage.state.due_s = stage.now() + self.delay / ms_per_s
            await stage.sleep_until(stage.state.due_s)
            await stage.forward(item)
            return


@dataclasses.dataclass(frozen=True)
class Timeout(Toxic):
    """Lets no data through (it is discarded) and closes the connection `timeout` ms after the
    toxic attached; with timeout 0 the connection stays open, silent, until the toxic is removed,
    and then closes (Toxiproxy does the same: the data it swallowed is gone)."""

    type_name: ClassVar[str] = "timeout"
    timeout: int = 0  # ms

    async def pipe(self, stage: Stage) -> None:
        deadline_s = stage.state.attached_at_s + self.timeout / ms_per_s
        while True:
            if self.timeout > 0:
                remaining_s = deadline_s - stage.now()
                if remaining_s <= 0:
                    await stage.inject(End(EndKind.CLOSE))
                    return
                try:
                    item = await asyncio.wait_for(stage.take(), remaining_s)
                except TimeoutError:
                    continue
            else:
                item = await stage.take()
            if isinstance(item, End):
                await stage.forward(item)
                return
            stage.drop()

    def end_on_removal(self) -> EndKind | None:
        return EndKind.CLOSE


@dataclasses.dataclass(frozen=True)
class ResetPeer(Toxic):
    """Once anything arrives, waits `timeout` ms and resets the connection (RST both ways)."""

    type_name: ClassVar[str] = "reset_peer"
    timeout: int = 0  # ms

    async def pipe(self, stage: Stage) -> None:
        await stage.take()
        if stage.state.due_s is None:
            stage.state.due_s = stage.now() + self.timeout / ms_per_s
        await stage.sleep_until(stage.state.due_s)
        await stage.forward(End(EndKind.RESET))


@dataclasses.dataclass(frozen=True)
class Slicer(Toxic):
    """Cuts each chunk into pieces of about average_size ± size_variation bytes, `delay` µs
    apart."""

    type_name: ClassVar[str] = "slicer"
    average_size: int = 0  # bytes
    size_variation: int = 0  # bytes
    delay: int = 0  # µs

    def check(self) -> None:
        if self.average_size < 1:
            raise ToxicAttributeError("slicer: average_size must be at least 1")
        if self.size_variation >= self.average_size:
            raise ToxicAttributeError("slicer: size_variation must be less than average_size")

    async def pipe(self, stage: Stage) -> None:
        while True:
            item = await stage.take()
            if isinstance(item, End):
                await stage.forward(item)
                return
            sizes = slice_sizes(len(item.data), average_bytes=self.average_size,
                                variation_bytes=self.size_variation, rng=stage.rng)
            for size_bytes in sizes:
                await stage.emit_part(size_bytes, at_s=item.at_s)
                await asyncio.sleep(self.delay / us_per_s)


@dataclasses.dataclass(frozen=True)
class LimitData(Toxic):
    """Lets `bytes` bytes through on the link, then closes the connection."""

    type_name: ClassVar[str] = "limit_data"
    bytes: int = 0

    async def pipe(self, stage: Stage) -> None:
        state = stage.state
        while True:
            item = await stage.take()
            if isinstance(item, End):
                await stage.forward(item)
                return
            allowed_bytes = min(len(item.data), self.bytes - state.bytes_passed)
            if allowed_bytes == len(item.data):
                await stage.forward(item)
            elif allowed_bytes > 0:
                await stage.emit_part(allowed_bytes, at_s=item.at_s)
            state.bytes_passed += max(allowed_bytes, 0)
            if state.bytes_passed >= self.bytes:
                await stage.inject(End(EndKind.CLOSE))
                return


toxic_types: dict[str, type[Toxic]] = {
    cls.type_name: cls
    for cls in (Latency, Bandwidth, SlowClose, Timeout, ResetPeer, Slicer, LimitData)
}


def slice_sizes(total_bytes: int, *, average_bytes: int, variation_bytes: int,
                rng: random.Random) -> list[int]:
    """Piece sizes, in order, for a chunk of `total_bytes`: halve until a piece is within
    average ± variation (Toxiproxy's scheme, which spreads small and large pieces evenly)."""
    sizes: list[int] = []
    pending = [(0, total_bytes)]
    while pending:
        start, end = pending.pop()
        if end - start - average_bytes <= variation_bytes:
            if end > start:
                sizes.append(end - start)
            continue
        middle = start + (end - start) // 2
        if variation_bytes > 0:
            middle += rng.randrange(2 * variation_bytes) - variation_bytes
        pending.append((middle, end))
        pending.append((start, middle))
    return sizes


def build_toxic(type_name: str, attributes: object, *, base: Toxic | None = None) -> Toxic:
    """The toxic of `type_name` with `attributes` set over `base`'s (or over the defaults).

    Raises KeyError for an unknown type, ToxicAttributeError for attributes it cannot take.
    Attributes the type does not have are ignored, as Toxiproxy does.
    """
    cls = toxic_types[type_name]
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict):
        raise ToxicAttributeError("attributes must be a JSON object")
    values = base.attributes() if base is not None else cls().attributes()
    for name in values:
        raw = attributes.get(name)
        if raw is not None:
            values[name] = _attribute_int(name, raw)
    toxic = cls(**values)
    toxic.check()
    return toxic


def _attribute_int(name: str, raw: object) -> int:
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ToxicAttributeError(f"attribute {name!r} must be an integer")
    if not 0 <= raw <= attribute_value_max:
        raise ToxicAttributeError(f"attribute {name!r} must be in 0..{attribute_value_max}")
    return raw
