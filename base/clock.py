"""Time, injected: the only place that reads the machine's clocks."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch (may jump)."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back."""
        ...


class SystemClock:
    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic_s: float = 1000.0) -> None:
        self._wall_ms = wall_ms
        self._monotonic_s = monotonic_s

    def wall_ms(self) -> int:
        return self._wall_ms

    def monotonic_s(self) -> float:
        return self._monotonic_s

    def advance(self, seconds: float) -> None:
        self._wall_ms += int(seconds * 1000)
        self._monotonic_s += seconds
