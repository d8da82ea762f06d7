"""Waking the coroutines that wait on futures: the one place that resolves a list of waiters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


def settle(waiters: Iterable[asyncio.Future[None]], error: BaseException | None = None) -> None:
    """Resolves every waiter that is not done yet (one cancelled by its caller is skipped):
    with None, or with `error` raised in it."""
    for waiter in waiters:
        if waiter.done():
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
