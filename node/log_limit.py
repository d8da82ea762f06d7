"""Rate limiting of repeated log lines, so that no caller can flood a node's log.

A `RepeatLimitFilter` on a handler lets at most `records_max` records of one (logger, message
template) through per `window_s`, counts the rest, and once the window has ended writes one
line saying how many it suppressed (when the next record of any kind reaches the handler, or on
`flush`). It tracks at most `templates_max` templates; beyond that the oldest is forgotten
(after its summary). The node installs one per root handler (`install`, called by server.run).

Thread-safe: records arrive from the event loop, the group-commit thread and Raft's thread.
Summaries are written after the lock is released, through the handler they belong to.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.clock import Clock, SystemClock

SUMMARY_ATTR = "raftlog_repeat_summary"  # set on the summary records this module writes
SUMMARY_TEMPLATE = "suppressed %d more lines like %r from %s (at most %d are written per %g s)"

Key = tuple[str, str]  # logger name, message template


@dataclass(slots=True)
class _Window:
    started_s: float
    passed: int = 0
    suppressed: int = 0
    level: int = logging.INFO


class RepeatLimitFilter(logging.Filter):
    def __init__(self, *, sink: Callable[[logging.LogRecord], object],
                 records_max: int | None = None,
                 window_s: float | None = None,
                 templates_max: int | None = None,
                 clock: Clock | None = None) -> None:
        """`sink` writes a summary record (the handler's `handle`); the bounds default to
        limits.log_repeats_max, log_repeat_window_s and log_templates_max."""
        super().__init__()
        self._sink = sink
        self._records_max = limits.log_repeats_max if records_max is None else records_max
        self._window_s: float = limits.log_repeat_window_s if window_s is None else window_s
        self._templates_max = limits.log_templates_max if templates_max is None else templates_max
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        # Open windows, oldest first: a window is only ever added at the end.
        self._windows: OrderedDict[Key, _Window] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, SUMMARY_ATTR, False):
            return True
        key = (record.name, str(record.msg))
        with self._lock:
            now_s = self._clock.monotonic_s()
            summaries = self._end_windows(now_s, force=False)
            passed = self._admit(key, record.levelno, now_s, summaries)
        for summary in summaries:
            self._sink(summary)
        return passed

    def flush(self) -> None:
        """Writes the summaries of every window with suppressed records, ended or not."""
        with self._lock:
            summaries = self._end_windows(self._clock.monotonic_s(), force=True)
        for summary in summaries:
            self._sink(summary)

    def _admit(self, key: Key, level: int, now_s: float, summaries: list[logging.LogRecord]
               ) -> bool:
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self._templates_max:
                summaries.extend(self._close(*self._windows.popitem(last=False)))
            window = self._windows[key] = _Window(started_s=now_s)
        if window.passed < self._records_max:
            window.passed += 1
            return True
        window.suppressed += 1
        window.level = max(window.level, level)
        return False

    def _end_windows(self, now_s: float, *, force: bool) -> list[logging.LogRecord]:
        """Forgets every ended window (every window when forced); returns the summaries of
        those that suppressed records."""
        summaries: list[logging.LogRecord] = []
        while self._windows:
            key = next(iter(self._windows))
            if not force and now_s - self._windows[key].started_s < self._window_s:
                break
            summaries.extend(self._close(key, self._windows.pop(key)))
        return summaries

    def _close(self, key: Key, window: _Window) -> list[logging.LogRecord]:
        if not window.suppressed:
            return []
        name, template = key
        record = logging.LogRecord(
            name=name, level=window.level, pathname=__file__, lineno=0, msg=SUMMARY_TEMPLATE,
            args=(window.suppressed, template, name, self._records_max, self._window_s),
            exc_info=None)
        setattr(record, SUMMARY_ATTR, True)
        return [record]


def install(logger: logging.Logger | None = None, *, clock: Clock | None = None,
            window_s: float | None = None) -> list[RepeatLimitFilter]:
    """Puts a RepeatLimitFilter on every handler of `logger` (default: the root logger);
    `window_s` None: limits.log_repeat_window_s."""
    filters = []
    for handler in (logger or logging.getLogger()).handlers:
        limiter = RepeatLimitFilter(sink=handler.handle, clock=clock, window_s=window_s)
        handler.addFilter(limiter)
        filters.append(limiter)
    return filters
