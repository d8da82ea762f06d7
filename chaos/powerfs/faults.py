"""Injected disk faults: a full disk (ENOSPC after a byte budget) and failing paths (EIO on
reads, writes or fsyncs of paths that match a glob). Pure state: the FUSE layer asks it before
each operation; `ok` clears everything.

Globs match the path inside the mount, starting with "/" (e.g. "/db/*.log"); `*` also matches
"/" (fnmatch), so "*.sst" matches at any depth.
"""

from __future__ import annotations

import errno
import fnmatch
import os
from dataclasses import dataclass, field

FAULT_OPS = ("read", "write", "fsync")  # what an EIO rule may fail; "fsync" covers fsyncdir


def os_error(code: int) -> OSError:
    """The OSError a FUSE callback raises to answer `-code` to the kernel."""
    return OSError(code, os.strerror(code))


@dataclass(frozen=True, slots=True)
class EioRule:
    """Operations in `ops` on paths matching `glob` fail with EIO."""

    glob: str
    ops: frozenset[str]

    def matches(self, op: str, path: str) -> bool:
        return op in self.ops and fnmatch.fnmatchcase(path, self.glob)


@dataclass(slots=True)
class Faults:
    """The faults in force. `bytes_left` None: the disk is not full."""

    bytes_left: int | None = None
    eio_rules: list[EioRule] = field(default_factory=list)
    injected: int = 0  # errors returned because of a fault, since the mount

    def check_eio(self, op: str, path: str | None) -> None:
        """Raises EIO when a rule fails `op` on `path` (None: an unlinked file, never matched)."""
        if path is None:
            return
        for rule in self.eio_rules:
            if rule.matches(op, path):
                self.injected += 1
                raise os_error(errno.EIO)

    def check_create(self) -> None:
        """Raises ENOSPC when the disk is full: no new file, directory or link."""
        if self.bytes_left is not None and self.bytes_left <= 0:
            self.injected += 1
            raise os_error(errno.ENOSPC)

    def take_bytes(self, wanted: int) -> int:
        """How many of `wanted` bytes a write may store (a short write when the budget runs out);
        raises ENOSPC when none."""
        if self.bytes_left is None or wanted == 0:
            return wanted
        if self.bytes_left <= 0:
            self.injected += 1
            raise os_error(errno.ENOSPC)
        granted = min(wanted, self.bytes_left)
        self.bytes_left -= granted
        return granted

    def add_eio(self, *, glob: str, ops: frozenset[str]) -> None:
        unknown = ops - set(FAULT_OPS)
        if unknown or not ops:
            raise ValueError(f"eio ops must be a non-empty subset of {FAULT_OPS}, "
                             f"not {sorted(ops)}")
        self.eio_rules.append(EioRule(glob=glob, ops=ops))

    def clear(self) -> None:
        self.bytes_left = None
        self.eio_rules.clear()
