"""The simulation's event loop: asyncio on virtual time, and which simulated node owns a task.

`VirtualTimeLoop` is an `asyncio.BaseEventLoop` with no selector and no file descriptors: when no
callback is ready it jumps its clock straight to the next timer, so `asyncio.sleep(5)` costs no
real time and two runs that schedule the same callbacks in the same order see the same times.
Callbacks run in FIFO order and timers by deadline (ties in the order they were scheduled), so
a run is a pure function of what the code schedules.

Ownership: every task records the simulated node incarnation that created it (a context
variable, inherited by the tasks a task creates), so that a crash cancels exactly the tasks of
that incarnation (`TaskOwners.cancel_owned`), as a killed process loses all of its own.

Bounds: a run that only ever finds callbacks ready without time moving (a busy loop) raises
`SimLivelock` after `idle_spins_max` iterations; one with nothing ready and no timer left raises
`SimDeadlock`.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

# The node incarnation ("n1#2") that owns the running code; "" for the simulator itself.
OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("sim_owner", default="")

idle_spins_max = 2_000_000  # loop iterations in a row at one virtual instant before a livelock
cancel_rounds_max = 20  # rounds of cancelling a crashed incarnation's tasks (some swallow one)
cancel_wait_s = 0.001  # virtual seconds one round waits for the cancelled tasks to end


class SimDeadlock(RuntimeError):
    """Nothing is ready and no timer is left: every task waits for something that never comes."""


class SimLivelock(RuntimeError):
    """Virtual time stood still for `idle_spins_max` loop iterations (a busy loop)."""


class _VirtualSelector:
    """Stands in for the selector: `select(timeout)` moves the loop's clock by `timeout`."""

    def __init__(self, loop: VirtualTimeLoop, *, spins_max: int) -> None:
        self._loop = loop
        self._spins = 0
        self._spins_max = spins_max

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimDeadlock(f"nothing to run at virtual time {self._loop.time():.3f} s")
        if timeout > 0:
            self._loop.advance(timeout)
            self._spins = 0
        else:
            self._spins += 1
            if self._spins > self._spins_max:
                raise SimLivelock(f"virtual time stuck at {self._loop.time():.3f} s for "
                                  f"{self._spins_max} loop iterations")
        return []

    def close(self) -> None:
        """Nothing to release."""


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An event loop whose `time()` is virtual; see the module docstring."""

    def __init__(self, *, spins_max: int = idle_spins_max) -> None:
        super().__init__()
        self._now_s = 0.0
        self._selector = _VirtualSelector(self, spins_max=spins_max)
        self.owners = TaskOwners()
        self.set_task_factory(self.owners.factory)

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        """Moves virtual time forward (only the selector does, when nothing is ready)."""
        self._now_s += seconds

    def _process_events(self, event_list: list[Any]) -> None:
        """No file descriptors, so no I/O events."""

    def _write_to_self(self) -> None:
        """`call_soon_threadsafe` needs no wake-up: the loop never blocks."""


class TaskOwners:
    """Which node incarnation created each task (see the module docstring). Tasks are kept in
    creation order (never in a set: a set of tasks iterates in address order, which differs
    from run to run)."""

    def __init__(self) -> None:
        self._owned: dict[str, list[asyncio.Task[Any]]] = {}
        self._prune_at = 64

    def factory(self, loop: asyncio.AbstractEventLoop,
                coro: Generator[Any, None, T] | Coroutine[Any, Any, T], /,
                context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task = asyncio.Task(coro, loop=loop, context=context)
        owner = context.get(OWNER, "") if context is not None else OWNER.get()
        if owner:
            tasks = self._owned.setdefault(owner, [])
            tasks.append(task)
            if len(tasks) >= self._prune_at:  # forget finished tasks now and then
                tasks[:] = [t for t in tasks if not t.done()]
                self._prune_at = max(64, 2 * len(tasks))
        return task

    def alive(self, owner: str) -> list[asyncio.Task[Any]]:
        return [task for task in self._owned.get(owner, ()) if not task.done()]

    async def cancel_owned(self, owner: str) -> int:
        """Cancels every task of `owner` until none is left (at most `cancel_rounds_max`
        rounds); the number still running after that (tasks that swallow cancellation)."""
        for _ in range(cancel_rounds_max):
            tasks = self.alive(owner)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=cancel_wait_s)
        left = self.alive(owner)
        self._owned[owner] = left
        return len(left)


def owner_context(owner: str) -> contextvars.Context:
    """A context in which code (and every task it creates) belongs to `owner`."""
    context = contextvars.copy_context()
    context.run(OWNER.set, owner)
    return context
