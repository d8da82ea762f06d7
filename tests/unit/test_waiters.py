"""base/waiters.py: the one helper that wakes waiters."""

from __future__ import annotations

import asyncio

import pytest

from raftlog.base.waiters import settle


def test_settle_resolves_pending_waiters_and_skips_done_ones() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        pending, cancelled, done = (loop.create_future() for _ in range(3))
        cancelled.cancel()
        done.set_result(None)
        settle([pending, cancelled, done])
        assert pending.result() is None and cancelled.cancelled()

    asyncio.run(scenario())


def test_settle_with_an_error_raises_it_in_each_waiter() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        waiters = [loop.create_future() for _ in range(2)]
        settle(waiters, RuntimeError("disk gone"))
        for waiter in waiters:
            with pytest.raises(RuntimeError, match="disk gone"):
                waiter.result()

    asyncio.run(scenario())
