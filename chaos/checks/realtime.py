"""The one real-time rule several checkers share: something that started after another thing
ended must see at least its value. A `Span` is an operation between `start` and `end` (history
positions, or seconds) carrying a value (a seq, an ack floor); `behind` finds each reader whose
value is below the largest value of a writer that had ended before the reader started.

Producer order (a producer's message first sent after another was acknowledged gets a higher
seq), ack floors (an observation made after another completed is not lower) and stale reads (a
read started more than the lease after an acknowledged write sees it) are this rule with
different writers, readers and slack."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

from raftlog.chaos.events import Op


@dataclass(frozen=True)
class Span:
    key: tuple[str, ...]  # only spans of one key are compared (a stream; producer and stream)
    start: float
    end: float
    value: int
    ops: tuple[Op, ...]
    label: str = ""  # what it is, for descriptions (a msg_id, a node)


def behind(writers: Iterable[Span], readers: Iterable[Span], *,
           slack: float = 0.0) -> list[tuple[Span, Span]]:
    """(writer, reader) for each reader whose value is below the largest value among the
    writers of its key with `writer.end + slack < reader.start`; the writer named is the first
    to end with that value. In the order the readers started."""
    writers_by_key: dict[tuple[str, ...], list[Span]] = collections.defaultdict(list)
    for writer in writers:
        writers_by_key[writer.key].append(writer)
    readers_by_key: dict[tuple[str, ...], list[Span]] = collections.defaultdict(list)
    for reader in readers:
        readers_by_key[reader.key].append(reader)
    found: list[tuple[Span, Span]] = []
    for key, key_readers in readers_by_key.items():
        ended = sorted(writers_by_key.get(key, []), key=lambda span: span.end)
        best: Span | None = None
        taken = 0
        for reader in sorted(key_readers, key=lambda span: span.start):
            while taken < len(ended) and ended[taken].end + slack < reader.start:
                if best is None or ended[taken].value > best.value:
                    best = ended[taken]
                taken += 1
            if best is not None and reader.value < best.value:
                found.append((best, reader))
    return sorted(found, key=lambda pair: pair[1].start)
