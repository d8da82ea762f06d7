"""Flusher (consumers/serving.py): a consumer's saves. A flush that finds no save in flight
starts one at once; flushes that find one in flight gather for `gather_s` and share one save;
no flush returns before a save that covers it completed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.serving import Flusher
from tests.async_tests import run_async

GATHER_S = 0.05


class _Saves:
    """Records when each save started; each completes when its gate opens."""

    def __init__(self) -> None:
        self.started: list[float] = []
        self.gates: list[asyncio.Event] = []

    def begin_save(self) -> asyncio.Task[bool]:
        self.started.append(asyncio.get_running_loop().time())
        gate = asyncio.Event()
        self.gates.append(gate)
        return asyncio.ensure_future(gate.wait())

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


async def _until(predicate: object, timeout_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert loop.time() < give_up_at, "condition not reached"
        await asyncio.sleep(0.001)


async def _one_in_flight(saves: _Saves, **options: Any) -> tuple[Flusher, asyncio.Future[None]]:
    """A flusher over `saves` with one flush whose save has started (and not completed)."""
    flusher = Flusher(saves.begin_save, **options)
    first = asyncio.ensure_future(flusher.flush())
    await _until(lambda: len(saves.started) == 1)
    return flusher, first


@run_async
async def test_a_flush_with_no_save_in_flight_saves_at_once() -> None:
    saves = _Saves()
    flusher = Flusher(saves.begin_save, gather_s=10.0)  # a window it must not wait for
    loop = asyncio.get_running_loop()
    asked = loop.time()
    flush = asyncio.ensure_future(flusher.flush())
    await _until(lambda: len(saves.started) == 1)
    assert saves.started[0] - asked < 1.0
    assert not flush.done()  # not before its save completed
    saves.open_all()
    await flush


@run_async
async def test_flushes_that_find_a_save_in_flight_gather_into_one_save() -> None:
    saves = _Saves()
    flusher, first = await _one_in_flight(saves, gather_s=GATHER_S)
    gathered_from = asyncio.get_running_loop().time()
    second = asyncio.ensure_future(flusher.flush())
    await asyncio.sleep(0.01)
    saves.gates[0].set()  # the save in flight ends early: the gathering goes on
    await first
    third = asyncio.ensure_future(flusher.flush())
    await asyncio.sleep(0.01)
    assert len(saves.started) == 1 and not second.done() and not third.done()
    await _until(lambda: len(saves.started) == 2)
    assert saves.started[1] - gathered_from >= GATHER_S * 0.9
    saves.open_all()
    await asyncio.gather(second, third)  # one save covered both
    assert len(saves.started) == 2


@run_async
async def test_without_a_window_a_flush_in_flight_starts_its_own_save() -> None:
    saves = _Saves()
    flusher = Flusher(saves.begin_save, gather_s=0.0, inflight_max=4)
    flushes = []
    for _ in range(3):  # one per loop turn
        flushes.append(asyncio.ensure_future(flusher.flush()))
        await _until(lambda: len(saves.started) == len(flushes))
    saves.open_all()
    await asyncio.gather(*flushes)


@run_async
async def test_a_gathered_save_waits_for_a_slot() -> None:
    saves = _Saves()
    flusher, first = await _one_in_flight(saves, gather_s=0.01, inflight_max=1)
    second = asyncio.ensure_future(flusher.flush())
    await asyncio.sleep(0.05)  # the window passed, the one slot is taken
    assert len(saves.started) == 1
    saves.gates[0].set()
    await first
    await _until(lambda: len(saves.started) == 2)
    saves.open_all()
    await second


@run_async
async def test_closing_while_gathering_fails_the_waiters_and_starts_no_save() -> None:
    saves = _Saves()
    flusher, first = await _one_in_flight(saves, gather_s=GATHER_S)
    gathering = asyncio.ensure_future(flusher.flush())
    await asyncio.sleep(0)
    flusher.close(RaftlogError(Reason.SHUTTING_DOWN, "closed"))
    with pytest.raises(RaftlogError) as caught:
        await gathering
    assert caught.value.reason == Reason.SHUTTING_DOWN
    await asyncio.sleep(GATHER_S * 2)
    assert len(saves.started) == 1  # the window's end started nothing
    saves.open_all()
    with pytest.raises(RaftlogError):
        await first  # closed before its save completed: settled with the close
