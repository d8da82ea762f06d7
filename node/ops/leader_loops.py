"""The loop shape shared by the work a node does for the streams it leads (source tails,
schedulers): every period, `reconcile()` starts a task for each stream that needs one and stops
the others; `stop()` ends them all. Subclasses keep their running tasks in `running` (key -> an
object with a `task`) and say how one is stopped (`_stop(key)`: it pops the key and cancels)."""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
K = TypeVar("K")


class ReconcileLoop(abc.ABC, Generic[K]):
    def __init__(self, *, period_s: float, what: str) -> None:
        self._period_s = period_s
        self._what = what  # for the log line of a failed round: "source tails", ...
        self._loop_task: asyncio.Task[None] | None = None

    @property
    @abc.abstractmethod
    def running(self) -> MutableMapping[K, Any]:
        """The running tasks by key (each value has a `task`)."""

    @abc.abstractmethod
    def reconcile(self) -> None:
        """Starts the tasks this node should run and stops the others."""

    @abc.abstractmethod
    def _stop(self, key: K) -> None:
        """Stops the task of `key` and forgets it."""

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._reconcile_forever())

    async def stop(self) -> None:
        tasks = [running.task for running in self.running.values()]
        if self._loop_task is not None:
            tasks.append(self._loop_task)
        for key in list(self.running):
            self._stop(key)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _reconcile_forever(self) -> None:
        while True:
            try:
                self.reconcile()
            except Exception:
                log.exception("starting or stopping %s failed", self._what)
            await asyncio.sleep(self._period_s)
