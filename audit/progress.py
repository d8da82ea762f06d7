"""Progress on stderr while the audit runs (phases, rows), and the time each phase took."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    def __init__(self, out: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic,
                 quiet: bool = False) -> None:
        self._out = out if out is not None else sys.stderr
        self._clock = clock
        self._start = clock()
        self._quiet = quiet
        self.timing_s: dict[str, float] = {}

    def say(self, message: str) -> None:
        if not self._quiet:
            print(f"[audit {self._clock() - self._start:6.1f}s] {message}", file=self._out,
                  flush=True)

    @contextmanager
    def phase(self, name: str, message: str = "") -> Iterator[None]:
        self.say(message or f"{name} ...")
        began = self._clock()
        try:
            yield
        finally:
            self.timing_s[name] = round(self.timing_s.get(name, 0.0) + self._clock() - began, 3)

    def elapsed_s(self) -> float:
        return self._clock() - self._start
