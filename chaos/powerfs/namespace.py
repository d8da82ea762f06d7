"""Unsynced directory entries: creates, renames and unlinks that a power cut may undo.

The backing directory always holds the *live* namespace (every create, rename and unlink is
applied at once) but only *durable* file data (unsynced data lives in extents.py). What a power
cut would restore is kept here as a delta per directory: the first time a name in directory D is
changed after D was last fsynced, the inode that name pointed to (or None: no entry) is recorded.
A directory fsync makes D's live entries durable by forgetting its delta.

An object that a delta still names is never destroyed: unlink, rmdir and rename-over move it
into the attic, `<backing>/.powerfs-attic/<inode>` (hidden from the mount), so that `drop` can
put it back. `drop` rebuilds the durable namespace from the deltas in three passes:
1. every live entry at a recorded name moves into the attic (unless it already is the durable
   one), so that every recorded name is free;
2. every recorded entry is put back: files (and symlinks) by hard link from wherever the inode
   is, directories by rename;
3. the attic is removed, and with it every object that no durable entry names.
Inodes identify objects: deltas hold `st_ino`, and nothing that a delta names is unlinked, so an
inode number cannot be reused while recorded. A file with two names may end up with both.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections import Counter
from dataclasses import dataclass

from raftlog.base.errors import InvariantViolation

log = logging.getLogger(__name__)

ATTIC_NAME = ".powerfs-attic"  # at the backing root; the mount hides it
_STAGE_PREFIX = "drop-"  # attic entries made by `drop` pass 1, never named by a delta


def _ino_or_none(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class DropReport:
    """What `drop` undid: names whose entry changed back, objects that went away."""

    names_restored: int
    objects_discarded: int


class Namespace:
    """Deltas of the backing directory's entries since each directory's last fsync."""

    def __init__(self, backing: str) -> None:
        self.root = backing
        self.attic = os.path.join(backing, ATTIC_NAME)
        self._deltas: dict[int, dict[str, int | None]] = {}  # dir inode -> name -> durable inode
        self._refs: Counter[int] = Counter()  # inode -> how many delta entries name it
        self._attic_inos: set[int] = set()
        if os.path.lexists(self.attic):
            log.warning("removing %s left by an earlier powerfs process", self.attic)
            shutil.rmtree(self.attic)

    # -- bookkeeping -------------------------------------------------------------------------

    def pending_dirs(self) -> int:
        return len(self._deltas)

    def pending_names(self) -> int:
        return sum(len(names) for names in self._deltas.values())

    def dir_inos(self) -> list[int]:
        """Directories with unsynced entries, in the order they were first changed."""
        return list(self._deltas)

    def record(self, parent: str, name: str) -> None:
        """Called before an entry `name` in directory `parent` (backing paths) changes."""
        names = self._deltas.setdefault(os.lstat(parent).st_ino, {})
        if name in names:
            return
        ino = _ino_or_none(os.path.join(parent, name))
        names[name] = ino
        if ino is not None:
            self._refs[ino] += 1

    def sync_dir(self, dir_ino: int) -> list[int]:
        """A directory fsync: its live entries become durable. Returns inodes the attic let go."""
        self._forget(dir_ino)
        return self._collect()

    def sync_all(self) -> list[int]:
        """Every live entry becomes durable (syncfs, a clean unmount)."""
        for dir_ino in list(self._deltas):
            self._forget(dir_ino)
        return self._collect()

    def _forget(self, dir_ino: int) -> None:
        for ino in (self._deltas.pop(dir_ino, None) or {}).values():
            if ino is not None:
                self._refs[ino] -= 1
                if self._refs[ino] <= 0:
                    del self._refs[ino]

    def _collect(self) -> list[int]:
        """Removes attic objects that no delta names; returns their inodes."""
        freed: list[int] = []
        changed = True
        while changed:
            changed = False
            for ino in [ino for ino in self._attic_inos if not self._refs[ino]]:
                path = os.path.join(self.attic, str(ino))
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    self._forget(ino)
                    shutil.rmtree(path)
                    changed = True
                else:
                    os.unlink(path)
                self._attic_inos.discard(ino)
                freed.append(ino)
        return freed

    # -- changes -----------------------------------------------------------------------------

    def remove(self, path: str) -> int:
        """unlink or rmdir of `path` after `record`: keeps the object in the attic when a delta
        names it. Returns its inode."""
        st = os.lstat(path)
        is_dir = stat.S_ISDIR(st.st_mode)
        if is_dir and os.listdir(path):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)  # before any move
        if self._refs[st.st_ino]:
            self._to_attic(path, st.st_ino)
        elif is_dir:
            os.rmdir(path)
            self._forget(st.st_ino)
        else:
            os.unlink(path)
        return st.st_ino

    def _to_attic(self, path: str, ino: int) -> None:
        if ino in self._attic_inos:  # another name of this file is already kept
            os.unlink(path)
            return
        os.makedirs(self.attic, exist_ok=True)
        os.rename(path, os.path.join(self.attic, str(ino)))
        self._attic_inos.add(ino)

    # -- power loss --------------------------------------------------------------------------

    def drop(self) -> DropReport:
        """Makes the backing directory's namespace the durable one (see the module docstring)."""
        if not self._deltas:
            self._clear_attic()
            return DropReport(names_restored=0, objects_discarded=0)
        index = self._index()
        in_place, discarded = self._vacate(index)
        restored = self._restore(self._index(), in_place)
        self._clear_attic()
        return DropReport(names_restored=restored, objects_discarded=discarded)

    def _vacate(self, index: dict[int, str]) -> tuple[set[tuple[int, str]], int]:
        """Pass 1: frees every recorded name. Returns the names that already hold their durable
        entry, and how many live objects went to the attic."""
        os.makedirs(self.attic, exist_ok=True)
        in_place: set[tuple[int, str]] = set()
        moved = 0
        for dir_ino, names in self._deltas.items():
            for name, durable_ino in names.items():
                path = os.path.join(self._locate(index, dir_ino), name)
                live = _ino_or_none(path)
                if live is None:
                    continue
                if live == durable_ino:
                    in_place.add((dir_ino, name))
                    continue
                is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
                os.rename(path, os.path.join(self.attic, f"{_STAGE_PREFIX}{moved}"))
                moved += 1
                if is_dir:
                    index = self._index()  # everything under it moved
                    continue
                index[live] = os.path.join(self.attic, f"{_STAGE_PREFIX}{moved - 1}")
        return in_place, moved

    def _restore(self, index: dict[int, str], in_place: set[tuple[int, str]]) -> int:
        """Pass 2: puts every recorded durable entry back. Returns how many."""
        restored = 0
        for dir_ino, names in self._deltas.items():
            for name, durable_ino in names.items():
                if durable_ino is None or (dir_ino, name) in in_place:
                    continue
                source = self._locate(index, durable_ino)
                target = os.path.join(self._locate(index, dir_ino), name)
                if stat.S_ISDIR(os.lstat(source).st_mode):
                    os.rename(source, target)
                    index = self._index()
                else:
                    os.link(source, target, follow_symlinks=False)
                restored += 1
        return restored

    def _locate(self, index: dict[int, str], ino: int) -> str:
        path = index.get(ino)
        if path is None:
            raise InvariantViolation(f"powerfs: inode {ino} named by a delta is nowhere in "
                                     f"{self.root}; the durable namespace cannot be rebuilt")
        return path

    def _index(self) -> dict[int, str]:
        """Inode -> one path, for everything under the backing root (attic included)."""
        index = {os.lstat(self.root).st_ino: self.root}
        pending = [self.root]
        while pending:
            directory = pending.pop()
            with os.scandir(directory) as entries:
                for entry in entries:
                    # st_ino, not d_ino: they differ on overlay file systems
                    index.setdefault(entry.stat(follow_symlinks=False).st_ino, entry.path)
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        return index

    def _clear_attic(self) -> None:
        if os.path.lexists(self.attic):
            shutil.rmtree(self.attic)
        self._deltas.clear()
        self._refs.clear()
        self._attic_inos.clear()
