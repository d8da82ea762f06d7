"""The unsynced state of one file, held in memory: what a page cache holds and a disk does not.

`DirtyFile` owns the rules for one inode's data between fsyncs: writes land in sorted,
non-overlapping extents; the live size and the lowest size the file was truncated to since the
last fsync (`floor`) say which durable bytes still show through. It does no I/O: reads take the
durable bytes as an argument and `flush_plan` says what to write where, so the FUSE layer does
the one pwrite/ftruncate pass and this module stays testable on bytes alone.

Contract (offsets in bytes, ranges `[start, end)`):
- live content = durable content cut at `floor`, zero-filled to `size`, then every extent on top;
- an extent never reaches past `size` (a truncate cuts extents it crosses);
- `durable_size` is the backing file's size when this state began and never changes here.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from dataclasses import dataclass

page_bytes = 4096  # the unit `writeback` keeps or loses, as a disk's page cache would


@dataclass(frozen=True, slots=True)
class FlushPlan:
    """What makes the backing file equal to the live content: cut to `cut_to` (when not None),
    write each `(offset, bytes)`, then set the size to `size`."""

    cut_to: int | None
    writes: tuple[tuple[int, bytes], ...]
    size: int


class DirtyFile:
    """Unsynced writes and size changes of one inode, since its last fsync."""

    __slots__ = ("_datas", "_ends", "_starts", "dirty_bytes", "durable_size", "floor", "seq",
                 "size")

    def __init__(self, *, durable_size: int, seq: int) -> None:
        self.durable_size = durable_size
        self.size = durable_size  # live size
        self.floor = durable_size  # durable bytes at or past this offset are gone (truncated)
        self.seq = seq  # order in which files became dirty: makes `writeback` reproducible
        self.dirty_bytes = 0  # sum of extent lengths
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._datas: list[bytearray] = []

    def is_clean(self) -> bool:
        """True when the live content equals the durable content."""
        return (not self._starts and self.size == self.durable_size
                and self.floor == self.durable_size)

    def extents(self) -> Iterator[tuple[int, bytes]]:
        """The unsynced extents, ascending: `(offset, data)`."""
        for start, data in zip(self._starts, self._datas, strict=True):
            yield start, bytes(data)

    def write(self, offset: int, data: bytes) -> None:
        """Records a write of `data` at `offset`; grows the live size if it writes past it."""
        if not data:
            return
        end = offset + len(data)
        last = len(self._starts) - 1
        if last >= 0 and self._ends[last] == offset:  # the append fast path (WAL, SST writes)
            self._datas[last] += data
            self._ends[last] = end
            self.dirty_bytes += len(data)
        else:
            self._merge(offset, end, data)
        self.size = max(self.size, end)

    def _merge(self, offset: int, end: int, data: bytes) -> None:
        first = bisect.bisect_left(self._ends, offset)  # first extent ending at or after offset
        stop = bisect.bisect_right(self._starts, end)  # extents starting at or before end
        if first < stop and self._starts[first] <= offset and end <= self._ends[first]:
            start = self._starts[first]
            self._datas[first][offset - start:end - start] = data  # overwrite inside one extent
            return
        merged = bytearray()
        new_start = offset
        if first < stop and self._starts[first] < offset:
            new_start = self._starts[first]
            merged += self._datas[first][:offset - new_start]
        merged += data
        new_end = end
        if first < stop and self._ends[stop - 1] > end:
            tail = self._datas[stop - 1]
            merged += tail[end - self._starts[stop - 1]:]
            new_end = self._ends[stop - 1]
        removed = sum(len(self._datas[i]) for i in range(first, stop))
        self._starts[first:stop] = [new_start]
        self._ends[first:stop] = [new_end]
        self._datas[first:stop] = [merged]
        self.dirty_bytes += len(merged) - removed

    def truncate(self, size: int) -> None:
        """Sets the live size; bytes past it are gone, and read as zeros if the file grows."""
        if size < self.size:
            cut = bisect.bisect_left(self._ends, size + 1)  # first extent that ends past size
            if cut < len(self._starts) and self._starts[cut] < size:
                keep = size - self._starts[cut]
                self.dirty_bytes -= len(self._datas[cut]) - keep
                del self._datas[cut][keep:]
                self._ends[cut] = size
                cut += 1
            self.dirty_bytes -= sum(len(data) for data in self._datas[cut:])
            del self._starts[cut:], self._ends[cut:], self._datas[cut:]
            self.floor = min(self.floor, size)
        self.size = size

    def durable_range(self, offset: int, length: int) -> tuple[int, int]:
        """The part `[start, end)` of a read that the durable bytes supply (maybe empty)."""
        end = min(offset + length, self.size, self.floor, self.durable_size)
        return offset, max(offset, end)

    def read(self, offset: int, length: int, durable: bytes) -> bytes:
        """The live bytes `[offset, offset + length)` clipped to the live size. `durable` is the
        backing file's bytes for `durable_range(offset, length)`."""
        end = min(offset + length, self.size)
        if end <= offset:
            return b""
        out = bytearray(durable[:end - offset])
        if len(out) < end - offset:
            out += bytes(end - offset - len(out))
        index = bisect.bisect_right(self._ends, offset)  # first extent ending past offset
        while index < len(self._starts) and self._starts[index] < end:
            start, data = self._starts[index], self._datas[index]
            lo, hi = max(start, offset), min(self._ends[index], end)
            out[lo - offset:hi - offset] = data[lo - start:hi - start]
            index += 1
        return bytes(out)

    def flush_plan(self) -> FlushPlan:
        """Everything unsynced, to be made durable by an fsync."""
        cut_to = self.floor if self.floor < self.durable_size else None
        writes = tuple(self.extents())
        return FlushPlan(cut_to=cut_to, writes=writes, size=self.size)

    def partial_plan(self, rng: random.Random, fraction: float) -> FlushPlan:
        """What a disk may have written before power failed: each page of each extent on its
        own with probability `fraction`, in no order; a truncate with the same probability."""
        cut_to = None
        if self.floor < self.durable_size and rng.random() < fraction:
            cut_to = self.floor
        writes: list[tuple[int, bytes]] = []
        for start, data in zip(self._starts, self._datas, strict=True):
            for page_start in range(start - start % page_bytes, start + len(data), page_bytes):
                lo = max(page_start, start)
                hi = min(page_start + page_bytes, start + len(data))
                if rng.random() < fraction:
                    writes.append((lo, bytes(data[lo - start:hi - start])))
        rng.shuffle(writes)
        base = self.durable_size if cut_to is None else cut_to
        size = max([base, *(offset + len(data) for offset, data in writes)])
        return FlushPlan(cut_to=cut_to, writes=tuple(writes), size=size)
