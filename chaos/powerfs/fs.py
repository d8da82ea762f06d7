"""The FUSE operations of powerfs: a pass-through to a backing directory whose unsynced writes
live in memory, and the commands that cut power, write back part of them or inject faults.

Owns every rule about what is durable:
- file data and size changes are durable after fsync/fdatasync of the file (or a write through
  an O_SYNC/O_DSYNC handle); until then they live in one `DirtyFile` per inode (extents.py) and
  every read of the live system sees them, as a page cache would;
- a create, mkdir, link, symlink, rename, unlink or rmdir is durable after an fsync of the
  directory that holds the entry (namespace.py); a rename needs both directories;
- `drop` forgets everything else; `writeback` first writes a seeded random subset of unsynced
  pages and directories, as a disk may before power fails; `sync` makes everything durable (a
  clean unmount does the same).
Not modelled: syncfs(2) and sync(2) (FUSE sends nothing for them: use the `sync` command),
metadata (mode, owner, times: applied at once), xattrs (unsupported), and a disk that reorders
or tears a directory's entries (a directory's entries become durable together).

Every entry point takes one lock: the FUSE loop is single-threaded and the control thread
drives the commands. Handles opened before a `drop` answer EIO afterwards: a process that kept
files open across a power cut cannot exist.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
import stat
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from raftlog.chaos.powerfs.extents import DirtyFile, FlushPlan
from raftlog.chaos.powerfs.faults import Faults, os_error
from raftlog.chaos.powerfs.namespace import ATTIC_NAME, Namespace

log = logging.getLogger(__name__)

dirty_bytes_max_default = 256 * 1024 * 1024  # past this, the oldest dirty files are written back
_RENAME_NOREPLACE = 1  # linux/fs.h
_RENAME_EXCHANGE = 2
_FALLOC_FL_KEEP_SIZE = 1  # linux/falloc.h
# Open flags the backing file does not get: powerfs creates, truncates, appends and syncs itself.
_STRIPPED_OPEN_FLAGS = (os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_APPEND | os.O_DIRECT
                        | os.O_SYNC | os.O_DSYNC | os.O_ACCMODE)
_STAT_FIELDS = ("st_mode", "st_ino", "st_dev", "st_nlink", "st_uid", "st_gid", "st_size",
                "st_blocks", "st_blksize", "st_rdev")
_STATVFS_FIELDS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                   "f_ffree", "f_favail", "f_flag", "f_namemax")
_BLOCK_BYTES = 512  # the unit of st_blocks

P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[Concatenate[PowerFsOperations, P], R],
            ) -> Callable[Concatenate[PowerFsOperations, P], R]:
    def run(self: PowerFsOperations, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)
    functools.update_wrapper(run, method)  # mfusepy reads create()'s signature
    return run


@dataclass(slots=True)
class _Handle:
    fd: int  # on the backing file
    ino: int
    readable_writable: bool  # fd is O_RDWR
    sync_writes: bool  # opened with O_SYNC or O_DSYNC
    epoch: int  # drops before this handle was opened


@dataclass(slots=True)
class _Inode:
    dirty: DirtyFile
    fd: int  # powerfs's own O_RDWR descriptor: keeps the inode (and its number) alive


@dataclass(slots=True)
class _Counters:
    writes: int = 0
    fsyncs: int = 0
    dir_fsyncs: int = 0
    drops: int = 0
    forced_writeback_bytes: int = 0  # unsynced bytes written back because memory ran short


def _apply(fd: int, plan: FlushPlan) -> None:
    """Makes the backing file match `plan`."""
    if plan.cut_to is not None:
        os.ftruncate(fd, plan.cut_to)
    for offset, data in plan.writes:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    if os.fstat(fd).st_size != plan.size:
        os.ftruncate(fd, plan.size)


class PowerFsOperations:
    """mfusepy operations over `backing` (see the module docstring). `on_init` and
    `on_destroy` run when the kernel mounts and unmounts."""

    use_ns = True  # mfusepy: times in nanoseconds

    def __init__(self, backing: str, *, dirty_bytes_max: int = dirty_bytes_max_default,
                 on_init: Callable[[], None] | None = None,
                 on_destroy: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._root = os.path.realpath(backing)
        self._attic_path = "/" + ATTIC_NAME
        self._dirty_bytes_max = dirty_bytes_max
        self._on_init = on_init
        self._on_destroy = on_destroy
        self._ns = Namespace(self._root)
        self._faults = Faults()
        self._handles: dict[int, _Handle] = {}
        self._open: Counter[int] = Counter()  # inode -> open handles
        self._inodes: dict[int, _Inode] = {}  # inodes with unsynced data
        self._dirty_bytes = 0
        self._next_fh = 1
        self._seq = 0
        self._epoch = 0
        self.counters = _Counters()

    # -- helpers -----------------------------------------------------------------------------

    def _real(self, path: str | None) -> str:
        if path is None:
            raise os_error(errno.ENOENT)
        if path == self._attic_path or path.startswith(self._attic_path + "/"):
            raise os_error(errno.ENOENT)
        return self._root if path == "/" else self._root + path

    def _handle(self, fh: int) -> _Handle:
        handle = self._handles.get(fh)
        if handle is None:
            raise os_error(errno.EBADF)
        if handle.epoch != self._epoch:
            raise os_error(errno.EIO)  # opened before the power cut
        return handle

    def _inode(self, handle: _Handle) -> _Inode:
        inode = self._inodes.get(handle.ino)
        if inode is None:
            if handle.readable_writable:
                fd = os.dup(handle.fd)
            else:
                fd = os.open(f"/proc/self/fd/{handle.fd}", os.O_RDWR | os.O_CLOEXEC)
            self._seq += 1
            inode = _Inode(DirtyFile(durable_size=os.fstat(fd).st_size, seq=self._seq), fd)
            self._inodes[handle.ino] = inode
        return inode

    def _flush(self, ino: int) -> int:
        """Writes the inode's unsynced state to the backing file; returns the bytes written."""
        inode = self._inodes.pop(ino, None)
        if inode is None:
            return 0
        try:
            _apply(inode.fd, inode.dirty.flush_plan())
        except OSError:
            self._inodes[ino] = inode
            raise
        self._dirty_bytes -= inode.dirty.dirty_bytes
        os.close(inode.fd)
        return inode.dirty.dirty_bytes

    def _discard(self, ino: int) -> None:
        inode = self._inodes.pop(ino, None)
        if inode is not None:
            self._dirty_bytes -= inode.dirty.dirty_bytes
            os.close(inode.fd)

    def _maybe_forget(self, ino: int) -> None:
        """Discards the unsynced data of an inode that no name and no handle reaches."""
        inode = self._inodes.get(ino)
        if inode is not None and not self._open[ino] and os.fstat(inode.fd).st_nlink == 0:
            self._discard(ino)

    def _maybe_evict(self) -> None:
        """Writes back the oldest dirty files while unsynced data exceeds its memory bound."""
        for ino in sorted(self._inodes, key=lambda ino: self._inodes[ino].dirty.seq):
            if self._dirty_bytes <= self._dirty_bytes_max // 2:
                return
            self.counters.forced_writeback_bytes += self._flush(ino)

    def _change_dirty(self, inode: _Inode, change: Callable[[DirtyFile], None]) -> None:
        before = inode.dirty.dirty_bytes
        change(inode.dirty)
        self._dirty_bytes += inode.dirty.dirty_bytes - before

    def _record(self, real: str) -> None:
        parent, name = os.path.split(real)
        self._ns.record(parent, name)

    def _new_handle(self, fd: int, flags: int, *, readable_writable: bool) -> int:
        fh = self._next_fh
        self._next_fh += 1
        ino = os.fstat(fd).st_ino
        self._handles[fh] = _Handle(fd=fd, ino=ino, readable_writable=readable_writable,
                                    sync_writes=bool(flags & os.O_DSYNC), epoch=self._epoch)
        self._open[ino] += 1
        return fh

    def _truncate_handle(self, handle: _Handle, length: int) -> None:
        self._change_dirty(self._inode(handle), lambda dirty: dirty.truncate(length))
        inode = self._inodes[handle.ino]
        if handle.sync_writes or inode.dirty.is_clean():
            self._flush(handle.ino)

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self, path: str) -> None:
        if self._on_init is not None:
            self._on_init()

    def destroy(self, path: str) -> None:
        """A clean unmount makes everything durable, as umount(8) does on a real disk."""
        self.sync()
        if self._on_destroy is not None:
            self._on_destroy()

    # -- attributes and directories ----------------------------------------------------------

    @_locked
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        if fh is not None and fh in self._handles:
            st = os.fstat(self._handle(fh).fd)
        else:
            st = os.lstat(self._real(path))
        attrs: dict[str, Any] = {name: getattr(st, name) for name in _STAT_FIELDS}
        attrs["st_atime"], attrs["st_mtime"] = st.st_atime_ns, st.st_mtime_ns
        attrs["st_ctime"] = st.st_ctime_ns
        inode = self._inodes.get(st.st_ino)
        if inode is not None and stat.S_ISREG(st.st_mode):
            attrs["st_size"] = inode.dirty.size
            attrs["st_blocks"] = -(-inode.dirty.size // _BLOCK_BYTES)
        return attrs

    @_locked
    def access(self, path: str | None, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise os_error(errno.EACCES)
        return 0

    @_locked
    def readlink(self, path: str | None) -> str:
        return os.readlink(self._real(path))

    @_locked
    def opendir(self, path: str | None) -> int:
        if not os.path.isdir(self._real(path)):
            raise os_error(errno.ENOTDIR)
        return 0

    @_locked
    def readdir(self, path: str | None, fh: int) -> list[str]:
        names = os.listdir(self._real(path))
        if path == "/":
            names = [name for name in names if name != ATTIC_NAME]
        return [".", "..", *names]

    @_locked
    def releasedir(self, path: str | None, fh: int) -> int:
        return 0

    @_locked
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self._faults.check_eio("fsync", path)
        for ino in self._ns.sync_dir(os.lstat(self._real(path)).st_ino):
            self._maybe_forget(ino)
        self.counters.dir_fsyncs += 1
        return 0

    @_locked
    def statfs(self, path: str | None) -> dict[str, int]:
        st = os.statvfs(self._root)
        attrs = {name: getattr(st, name) for name in _STATVFS_FIELDS}
        if self._faults.bytes_left is not None:
            free = max(0, self._faults.bytes_left) // max(1, st.f_frsize)
            attrs["f_bfree"] = min(attrs["f_bfree"], free)
            attrs["f_bavail"] = min(attrs["f_bavail"], free)
        return attrs

    @_locked
    def chmod(self, path: str | None, mode: int) -> int:
        if path is not None:
            os.chmod(self._real(path), mode, follow_symlinks=False)
        return 0

    @_locked
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        if path is not None:
            os.chown(self._real(path), uid, gid, follow_symlinks=False)
        return 0

    @_locked
    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        if path is not None:
            if times is None:
                os.utime(self._real(path), follow_symlinks=False)
            else:
                os.utime(self._real(path), ns=times, follow_symlinks=False)
        return 0

    # -- namespace ---------------------------------------------------------------------------

    @_locked
    def mkdir(self, path: str | None, mode: int) -> int:
        real = self._real(path)
        self._faults.check_create()
        self._record(real)
        os.mkdir(real, mode)
        return 0

    @_locked
    def mknod(self, path: str | None, mode: int, dev: int) -> int:
        real = self._real(path)
        self._faults.check_create()
        self._record(real)
        os.mknod(real, mode, dev)
        return 0

    @_locked
    def symlink(self, target: str | None, source: str) -> int:
        """Creates the symlink `target` whose content is `source` (mfusepy's naming)."""
        real = self._real(target)
        self._faults.check_create()
        self._record(real)
        os.symlink(source, real)
        return 0

    @_locked
    def link(self, target: str | None, source: str | None) -> int:
        """Creates the name `target` for the file `source`."""
        real = self._real(target)
        self._faults.check_create()
        self._record(real)
        os.link(self._real(source), real, follow_symlinks=False)
        return 0

    @_locked
    def unlink(self, path: str | None) -> int:
        real = self._real(path)
        self._record(real)
        self._maybe_forget(self._ns.remove(real))
        return 0

    @_locked
    def rmdir(self, path: str | None) -> int:
        real = self._real(path)
        self._record(real)
        self._ns.remove(real)
        return 0

    @_locked
    def rename(self, old: str | None, new: str | None, flags: int = 0) -> int:
        if flags & _RENAME_EXCHANGE:
            raise os_error(errno.EINVAL)
        source, target = self._real(old), self._real(new)
        source_st = os.lstat(source)
        try:
            target_st: os.stat_result | None = os.lstat(target)
        except FileNotFoundError:
            target_st = None
        if target_st is not None:
            if flags & _RENAME_NOREPLACE:
                raise os_error(errno.EEXIST)
            if target_st.st_ino == source_st.st_ino:
                return 0  # two names of one file: rename(2) does nothing
            self._check_replace(source, source_st, target, target_st)
        elif stat.S_ISDIR(source_st.st_mode) and (target + "/").startswith(source + "/"):
            raise os_error(errno.EINVAL)
        self._record(source)
        self._record(target)
        if target_st is not None:
            self._ns.remove(target)
        os.rename(source, target)
        if target_st is not None:
            self._maybe_forget(target_st.st_ino)
        return 0

    @staticmethod
    def _check_replace(source: str, source_st: os.stat_result, target: str,
                       target_st: os.stat_result) -> None:
        """The errors rename(2) gives when `target` cannot be replaced by `source`."""
        source_dir, target_dir = stat.S_ISDIR(source_st.st_mode), stat.S_ISDIR(target_st.st_mode)
        if target_dir and not source_dir:
            raise os_error(errno.EISDIR)
        if source_dir and not target_dir:
            raise os_error(errno.ENOTDIR)
        if target_dir and os.listdir(target):
            raise os_error(errno.ENOTEMPTY)
        if source_dir and (target + "/").startswith(source + "/"):
            raise os_error(errno.EINVAL)

    # -- files -------------------------------------------------------------------------------

    @_locked
    def create(self, path: str | None, mode: int, flags: int) -> int:
        real = self._real(path)
        self._faults.check_create()
        self._record(real)
        fd = os.open(real, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | (flags & os.O_EXCL), mode)
        fh = self._new_handle(fd, flags, readable_writable=True)
        if flags & os.O_TRUNC:
            self._truncate_handle(self._handles[fh], 0)
        return fh

    @_locked
    def open(self, path: str | None, flags: int) -> int:
        real = self._real(path)
        backing_flags = (flags & ~_STRIPPED_OPEN_FLAGS) | os.O_CLOEXEC
        try:
            fd = os.open(real, backing_flags | os.O_RDWR)
            readable_writable = True
        except (IsADirectoryError, PermissionError):
            fd = os.open(real, backing_flags | (flags & os.O_ACCMODE))
            readable_writable = False
        fh = self._new_handle(fd, flags, readable_writable=readable_writable)
        if flags & os.O_TRUNC:
            self._truncate_handle(self._handles[fh], 0)
        return fh

    @_locked
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        handle = self._handle(fh)
        self._faults.check_eio("read", path)
        inode = self._inodes.get(handle.ino)
        if inode is None:
            return os.pread(handle.fd, size, offset)
        start, end = inode.dirty.durable_range(offset, size)
        durable = os.pread(inode.fd, end - start, start) if end > start else b""
        return inode.dirty.read(offset, size, durable)

    @_locked
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        self._faults.check_eio("write", path)
        granted = self._faults.take_bytes(len(data))
        if granted < len(data):
            data = data[:granted]
        self._change_dirty(self._inode(handle), lambda dirty: dirty.write(offset, data))
        self.counters.writes += 1
        if handle.sync_writes:
            self._flush(handle.ino)
        elif self._dirty_bytes > self._dirty_bytes_max:
            self._maybe_evict()
        return granted

    @_locked
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._faults.check_eio("write", path)
        if fh is not None:
            self._truncate_handle(self._handle(fh), length)
            return 0
        real = self._real(path)
        if not stat.S_ISREG(os.lstat(real).st_mode):
            os.truncate(real, length)  # the error truncate(2) gives
            return 0
        fh = self._new_handle(os.open(real, os.O_RDWR | os.O_CLOEXEC), 0, readable_writable=True)
        try:
            self._truncate_handle(self._handles[fh], length)
        finally:
            self._release(fh)
        return 0

    @_locked
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        handle = self._handle(fh)
        if mode == _FALLOC_FL_KEEP_SIZE:
            return 0  # preallocation only: nothing a reader or a power cut could tell
        if mode != 0:
            raise os_error(errno.EOPNOTSUPP)
        self._faults.check_eio("write", path)
        inode = self._inodes.get(handle.ino)
        size_now = inode.dirty.size if inode is not None else os.fstat(handle.fd).st_size
        growth = offset + size - size_now
        if growth > 0:
            if self._faults.take_bytes(growth) < growth:
                raise os_error(errno.ENOSPC)
            self._truncate_handle(handle, offset + size)
        return 0

    @_locked
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        handle = self._handle(fh)
        try:
            self._faults.check_eio("fsync", path)
        except OSError:
            self._discard(handle.ino)  # as Linux does: the failed pages are clean now, and lost
            raise
        self._flush(handle.ino)
        self.counters.fsyncs += 1
        return 0

    @_locked
    def release(self, path: str | None, fh: int) -> int:
        self._release(fh)
        return 0

    def _release(self, fh: int) -> None:
        handle = self._handles.pop(fh, None)
        if handle is None:
            return
        self._open[handle.ino] -= 1
        if self._open[handle.ino] <= 0:
            del self._open[handle.ino]
        os.close(handle.fd)
        self._maybe_forget(handle.ino)

    # -- commands ----------------------------------------------------------------------------

    @_locked
    def drop(self) -> dict[str, int]:
        """Power loss: forgets every unsynced write and entry; open handles go stale."""
        return self._drop()

    def _drop(self) -> dict[str, int]:
        dropped_bytes, dropped_files = self._dirty_bytes, len(self._inodes)
        for ino in list(self._inodes):
            self._discard(ino)
        self._epoch += 1
        report = self._ns.drop()
        self.counters.drops += 1
        return {"dropped_bytes": dropped_bytes, "dropped_files": dropped_files,
                "names_restored": report.names_restored,
                "objects_discarded": report.objects_discarded,
                "stale_handles": len(self._handles)}

    @_locked
    def writeback(self, *, seed: int, fraction: float) -> dict[str, int]:
        """Writes back a seeded random `fraction` of unsynced pages, truncates and directories,
        then drops the rest."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1], not {fraction}")
        rng = random.Random(seed)
        pages = written = 0
        for inode in sorted(self._inodes.values(), key=lambda inode: inode.dirty.seq):
            plan = inode.dirty.partial_plan(rng, fraction)
            _apply(inode.fd, plan)
            pages += len(plan.writes)
            written += sum(len(data) for _, data in plan.writes)
        dirs = [ino for ino in self._ns.dir_inos() if rng.random() < fraction]
        for dir_ino in dirs:
            self._ns.sync_dir(dir_ino)
        report = self._drop()
        return {**report, "pages_written": pages, "bytes_written": written,
                "dirs_synced": len(dirs)}

    @_locked
    def sync(self) -> dict[str, int]:
        """Makes everything durable (what syncfs would do)."""
        written = sum(self._flush(ino) for ino in list(self._inodes))
        for ino in self._ns.sync_all():
            self._maybe_forget(ino)
        return {"bytes_written": written}

    @_locked
    def set_full(self, bytes_left: int) -> None:
        if bytes_left < 0:
            raise ValueError(f"bytes_left must be >= 0, not {bytes_left}")
        self._faults.bytes_left = bytes_left

    @_locked
    def set_eio(self, *, glob: str, ops: frozenset[str]) -> None:
        self._faults.add_eio(glob=glob, ops=ops)

    @_locked
    def ok(self) -> None:
        self._faults.clear()

    @_locked
    def status(self) -> dict[str, Any]:
        counters = self.counters
        return {
            "unsynced_bytes": self._dirty_bytes,
            "unsynced_files": len(self._inodes),
            "unsynced_dirs": self._ns.pending_dirs(),
            "unsynced_names": self._ns.pending_names(),
            "open_handles": len(self._handles),
            "full_bytes_left": self._faults.bytes_left,
            "eio_rules": [{"glob": rule.glob, "ops": sorted(rule.ops)}
                          for rule in self._faults.eio_rules],
            "injected_errors": self._faults.injected,
            "writes": counters.writes,
            "fsyncs": counters.fsyncs,
            "dir_fsyncs": counters.dir_fsyncs,
            "drops": counters.drops,
            "forced_writeback_bytes": counters.forced_writeback_bytes,
        }
