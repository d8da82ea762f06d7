"""Nemeses against an in-memory target: what they ask of the net and the processes."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from raftlog.chaos import nemesis
from raftlog.chaos.nemesis import Partition


class _SlowNet:
    """Each change takes a while in its worker thread; counts overlapping changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = 0
        self.overlaps = 0
        self.calls: list[str] = []

    def _change(self, what: str) -> None:
        with self._lock:
            self.busy += 1
            self.overlaps += self.busy > 1
            self.calls.append(what)
        time.sleep(0.02)
        with self._lock:
            self.busy -= 1

    def partition(self, groups: Sequence[Iterable[int]], *, one_way: bool = False) -> None:
        self._change("cut")

    def heal(self) -> None:
        self._change("heal")


class _Target:
    def __init__(self) -> None:
        self.rng = random.Random(1)
        self.net = _SlowNet()

    def node_indexes(self) -> list[int]:
        return [1, 2, 3]

    async def primary(self) -> int:
        return 1

    async def replica_set(self) -> list[int]:
        return [1, 2, 3]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def test_a_flapping_partition_stops_without_racing_its_own_heal(monkeypatch: Any) -> None:
    """Stopping while the flapper is inside a net change waits for it; the final heal never
    overlaps a change still running in a worker thread."""
    monkeypatch.setattr(nemesis, "flap_period_s", (0.001, 0.002))
    target = _Target()

    async def scenario() -> None:
        fault = Partition("primary", flapping=True)
        await fault.start(target)  # type: ignore[arg-type]
        await asyncio.sleep(0.15)
        await fault.stop(target)  # type: ignore[arg-type]

    asyncio.run(scenario())
    assert target.net.overlaps == 0
    assert target.net.calls[-1] == "heal" and target.net.calls.count("cut") >= 2


def test_a_minority_that_holds_most_copies_of_the_stream_leaves_no_majority() -> None:
    """5 nodes, the stream on 3: cutting off 2 of its copies leaves the cluster a majority but
    not the stream, whose availability is then not owed; cutting 2 others leaves both."""

    class _Five(_Target):
        def node_indexes(self) -> list[int]:
            return [1, 2, 3, 4, 5]

        async def replica_set(self) -> list[int]:
            return [2, 4, 5]

    async def majority_without(cut_off: list[int]) -> bool:
        return await nemesis._majority_left(_Five(), cut_off)  # type: ignore[arg-type]

    assert asyncio.run(majority_without([2, 4])) is False
    assert asyncio.run(majority_without([1, 3])) is True
    assert asyncio.run(majority_without([1, 2, 3])) is False
