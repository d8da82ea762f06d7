"""What one simulated run did, as a digest: every fault, client outcome, metadata command and
replication request is folded into a SHA-256 in the order it happened, with its virtual time.
Two runs of one seed must give the same digest (the determinism test); the last
`tail_lines_max` lines are kept to show what led up to a failure.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable

tail_lines_max = 40  # trace lines a failing verdict shows


class Trace:
    """The running digest of a run, and the tail of its readable lines."""

    def __init__(self, now_s: Callable[[], float]) -> None:
        self._now_s = now_s
        self._hash = hashlib.sha256()
        self.events = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines_max)

    def note(self, kind: str, detail: str = "") -> None:
        """Records one event (kept in the tail)."""
        line = f"{self._now_s():.6f} {kind} {detail}"
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        self.events += 1
        self.tail.append(line)

    def fold(self, detail: str) -> None:
        """Records a high-volume event in the digest only (replication traffic)."""
        self._hash.update(f"{self._now_s():.6f} {detail}\n".encode())
        self.events += 1

    def digest(self) -> str:
        return self._hash.hexdigest()[:16]
