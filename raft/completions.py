"""How pysyncobj's outcomes reach the event loop: its callbacks (tick thread) settle asyncio
futures, and its failure reasons become `RaftlogError`s.

- `failure_error` maps a pysyncobj `FAIL_REASON` to a `RaftlogError` (reason, message, and
  whether the command may still commit: `OUTCOME_NOT_COMMITTED` or `OUTCOME_UNKNOWN`);
- `_Completions` settles the futures of one loop, in order, one loop wake-up per batch;
- `_Bridge` is the callback handed to pysyncobj for one future;
- `_expire` fails a future whose call timed out (the outcome is unknown);
- `PendingCalls`, a group's calls waiting for pysyncobj: submits them with a bridge and a
  timeout, and fails those still waiting when the group closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON

from raftlog.base.errors import RaftlogError, Reason
from raftlog.raft.api import OUTCOME_NOT_COMMITTED, OUTCOME_UNKNOWN

_FAILURES: dict[int, tuple[Reason, str, str]] = {
    FAIL_REASON.QUEUE_FULL: (Reason.OVERLOADED, "too many metadata proposals waiting",
                             OUTCOME_NOT_COMMITTED),
    FAIL_REASON.MISSING_LEADER: (Reason.NO_LEADER, "the metadata group has no leader",
                                 OUTCOME_NOT_COMMITTED),
    FAIL_REASON.DISCARDED: (Reason.NO_LEADER, "another leader's entry replaced the command",
                            OUTCOME_NOT_COMMITTED),
    FAIL_REASON.NOT_LEADER: (Reason.NO_LEADER, "the command reached a node that is not leader",
                             OUTCOME_NOT_COMMITTED),
    FAIL_REASON.LEADER_CHANGED: (Reason.NO_LEADER, "the leader changed; the command may or "
                                 "may not commit", OUTCOME_UNKNOWN),
    FAIL_REASON.REQUEST_DENIED: (Reason.MEMBERSHIP_CHANGE_IN_PROGRESS,
                                 "another membership change is in progress",
                                 OUTCOME_NOT_COMMITTED),
    FAIL_REASON.UNKNOWN_OUTCOME: (Reason.NO_LEADER, "the command's outcome is unknown; it may "
                                  "or may not commit", OUTCOME_UNKNOWN),
}


def failure_error(fail_reason: int) -> RaftlogError:
    reason, message, outcome = _FAILURES.get(
        fail_reason, (Reason.INTERNAL, "unexpected raft failure", OUTCOME_UNKNOWN))
    return RaftlogError(reason, message, outcome=outcome, raft_fail_reason=fail_reason)


class _Completions:
    """Settles futures of one event loop from pysyncobj's tick thread, in order, with one
    loop wake-up per batch rather than one per command (a wake-up is a syscall)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[asyncio.Future[Any], Any, int]] = \
            collections.deque()
        self._scheduled = False

    def push(self, future: asyncio.Future[Any], result: Any, fail_reason: int) -> None:
        with self._lock:
            self._items.append((future, result, fail_reason))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, collections.deque()
            self._scheduled = False
        for future, result, fail_reason in items:
            if future.done():
                continue  # timed out or cancelled: the outcome is reported as unknown
            if fail_reason == FAIL_REASON.SUCCESS:
                future.set_result(result)
            else:
                future.set_exception(failure_error(fail_reason))


class _Bridge:
    """A pysyncobj callback (tick thread, or the caller's thread for QUEUE_FULL) that settles
    an asyncio future on its loop."""

    __slots__ = ("_completions", "_future")

    def __init__(self, completions: _Completions, future: asyncio.Future[Any]) -> None:
        self._completions = completions
        self._future = future

    def __call__(self, result: Any, fail_reason: int) -> None:
        self._completions.push(self._future, result, fail_reason)


def _expire(future: asyncio.Future[Any], what: str, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(RaftlogError(
            Reason.TIMEOUT, f"metadata {what} timed out after {timeout_s} s; it may or may not "
            "commit", outcome=OUTCOME_UNKNOWN))


class PendingCalls:
    """The calls of one group waiting for pysyncobj, on any number of event loops."""

    def __init__(self) -> None:
        self._pending: set[asyncio.Future[Any]] = set()
        self._completions: dict[asyncio.AbstractEventLoop, _Completions] = {}

    async def call(self, submit: Callable[[_Bridge], None], *, timeout_s: float,
                   what: str) -> Any:
        """Submits a pysyncobj call with a bridge to a new future and waits for it; TIMEOUT
        (outcome unknown) after `timeout_s`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, future, what, timeout_s)
        self._pending.add(future)
        try:
            submit(self.bridge(loop, future))
            return await future
        finally:
            timer.cancel()
            self._pending.discard(future)

    def bridge(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> _Bridge:
        """The pysyncobj callback that settles `future` (of `loop`)."""
        completions = self._completions.get(loop)
        if completions is None:
            completions = self._completions[loop] = _Completions(loop)
        return _Bridge(completions, future)

    def fail_all(self, reason: Reason, message: str) -> None:
        """Any thread: fails every waiting call (on its loop) with `RaftlogError(reason,
        message)`."""
        for future in list(self._pending):
            _fail_later(future, RaftlogError(reason, message))


def _fail_later(future: asyncio.Future[Any], error: RaftlogError) -> None:
    def fail() -> None:
        if not future.done():
            future.set_exception(error)
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(fail)
