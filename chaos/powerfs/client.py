"""`PowerFs`: the harness's handle on one powerfs mount. It starts the FUSE process
(`python -m raftlog.chaos.powerfs`), waits until the mount answers, sends control commands,
and unmounts: by `unmount()`, at the end of a `with` block, or at interpreter exit. The FUSE
process also unmounts itself when the process that started it dies.

Power loss, as a harness drives it: stop (or kill -9) the node that uses the mount, `drop()`
(or `writeback(seed=..., fraction=...)`), then start the node again on the same mount.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from raftlog.base import children
from raftlog.chaos.powerfs import control
from raftlog.chaos.powerfs.faults import FAULT_OPS
from raftlog.chaos.powerfs.install import LIBFUSE_ENV

mount_timeout_s = 20.0
unmount_timeout_s = 15.0
poll_interval_s = 0.02
socket_path_bytes_max = 100  # sun_path holds 108 bytes with the NUL; keep a margin
log_tail_bytes = 4000


class PowerFsError(Exception):
    """The mount could not be made or unmade, or a command failed."""


@dataclass(frozen=True, slots=True)
class PowerFsStatus:
    """What is unsynced, and the faults in force."""

    unsynced_bytes: int  # data bytes written and not fsynced
    unsynced_files: int  # files with unsynced data or size
    unsynced_dirs: int  # directories with unsynced entries
    unsynced_names: int  # entries a drop would change back
    open_handles: int
    full_bytes_left: int | None
    eio_rules: tuple[tuple[str, tuple[str, ...]], ...]  # (glob, ops)
    injected_errors: int
    writes: int
    fsyncs: int
    dir_fsyncs: int
    drops: int
    forced_writeback_bytes: int

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> PowerFsStatus:
        rules = tuple((str(rule["glob"]), tuple(rule["ops"])) for rule in raw["eio_rules"])
        return cls(**{**raw, "eio_rules": rules})


_live: set[PowerFs] = set()  # mounted by this process: unmounted at exit


@atexit.register
def _unmount_all() -> None:
    for fs in list(_live):
        with contextlib.suppress(Exception):
            fs.unmount()


def _is_mount(path: Path) -> bool:
    """Whether `path` is a mount point, also when its FUSE process died (ENOTCONN)."""
    wanted = str(path)
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as mounts:
        for line in mounts:
            fields = line.split(" ")
            if len(fields) > 1 and _unescape_mount_field(fields[1]) == wanted:
                return True
    return False


def _unescape_mount_field(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"),
                           ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _fusermount_unmount(mountpoint: Path, *, lazy: bool) -> bool:
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)]
    try:
        result = subprocess.run(args, capture_output=True, check=False, timeout=unmount_timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


class PowerFs:
    """One mounted powerfs. Make it with `PowerFs.mount(backing, mountpoint)`."""

    def __init__(self, *, backing: Path, mountpoint: Path, control_path: Path,
                 process: subprocess.Popen[bytes], log_path: Path, own_dir: Path | None) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.control_path = control_path
        self.log_path = log_path
        self._process = process
        self._own_dir = own_dir  # a temporary directory this object made and removes
        self._mounted = True
        _live.add(self)

    @classmethod
    def mount(cls, backing: Path, mountpoint: Path, *, log_path: Path | None = None,
              dirty_bytes_max: int | None = None, timeout_s: float = mount_timeout_s,
              ) -> PowerFs:
        """Starts the FUSE process over `backing` (created if missing) at `mountpoint` and
        returns once the mount answers. Raises PowerFsError with the process's log if not."""
        backing, mountpoint = Path(backing).resolve(), Path(mountpoint).resolve()
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        if _is_mount(mountpoint):
            raise PowerFsError(f"{mountpoint} is already a mount point")
        control_path, own_dir = cls._control_path(mountpoint)
        log_path = log_path or (own_dir or mountpoint.parent) / f"{mountpoint.name}.powerfs.log"
        args = [sys.executable, "-m", "raftlog.chaos.powerfs", "--backing", str(backing),
                "--mountpoint", str(mountpoint), "--control", str(control_path),
                "--parent-pid", str(os.getpid())]
        if dirty_bytes_max is not None:
            args += ["--dirty-bytes-max", str(dirty_bytes_max)]
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file,
                                       stderr=subprocess.STDOUT,
                                       env={**os.environ, **LIBFUSE_ENV})
        fs = cls(backing=backing, mountpoint=mountpoint, control_path=control_path,
                 process=process, log_path=log_path, own_dir=own_dir)
        try:
            fs._wait_mounted(timeout_s)
        except BaseException:
            fs.unmount()
            raise
        return fs

    @staticmethod
    def _control_path(mountpoint: Path) -> tuple[Path, Path | None]:
        beside = mountpoint.parent / f".{mountpoint.name}.powerfs.sock"
        if len(os.fsencode(beside)) <= socket_path_bytes_max:
            return beside, None
        own_dir = Path(tempfile.mkdtemp(prefix="powerfs-"))
        return own_dir / "control.sock", own_dir

    def _wait_mounted(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PowerFsError(f"powerfs exited with {self._process.returncode} before "
                                   f"mounting {self.mountpoint}:\n{self.log_tail()}")
            if self.control_path.exists() and _is_mount(self.mountpoint):
                with contextlib.suppress(PowerFsError):  # bound, not yet listening
                    self._call("ping")
                    return
            time.sleep(poll_interval_s)
        raise PowerFsError(f"powerfs did not mount {self.mountpoint} within {timeout_s} s:\n"
                           f"{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-log_tail_bytes:].decode(errors="replace")

    @property
    def pid(self) -> int:
        return self._process.pid

    def _call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        if not self._mounted:
            raise PowerFsError(f"{self.mountpoint} is not mounted")
        try:
            return control.call(str(self.control_path), {"cmd": cmd, **fields})
        except control.ControlError as error:
            raise PowerFsError(str(error)) from error

    # -- commands ----------------------------------------------------------------------------

    def drop(self) -> dict[str, int]:
        """Power loss: the backing directory keeps only what was synced. Stop the processes
        that use the mount first; handles they left open answer EIO afterwards."""
        report: dict[str, int] = self._call("drop")["report"]
        return report

    def writeback(self, *, seed: int, fraction: float) -> dict[str, int]:
        """A disk that wrote part of its cache: a seeded random `fraction` of unsynced pages
        (4 KiB) and directories becomes durable, the rest is dropped."""
        report: dict[str, int] = self._call("writeback", seed=seed, fraction=fraction)["report"]
        return report

    def sync(self) -> dict[str, int]:
        """Makes everything durable, as syncfs would."""
        report: dict[str, int] = self._call("sync")["report"]
        return report

    def set_full(self, bytes_left: int) -> None:
        """ENOSPC on writes past `bytes_left` more bytes, and on creates once none are left."""
        self._call("full", bytes_left=bytes_left)

    def set_eio(self, glob: str, *, ops: tuple[str, ...] = FAULT_OPS) -> None:
        """EIO on `ops` ("read", "write", "fsync") of paths inside the mount matching `glob`
        (fnmatch, e.g. "/db/*.log"). Rules add up; an fsync that fails loses the file's
        unsynced data, as on Linux."""
        self._call("eio", glob=glob, ops=list(ops))

    def ok(self) -> None:
        """Clears `set_full` and every `set_eio` rule."""
        self._call("ok")

    def status(self) -> PowerFsStatus:
        return PowerFsStatus.from_wire(self._call("status")["status"])

    # -- unmount -----------------------------------------------------------------------------

    def unmount(self) -> None:
        """Unmounts (a clean unmount: what is unsynced is written, as umount does; call
        `drop()` first for a power cut) and waits for the FUSE process. Idempotent."""
        if not self._mounted:
            return
        self._mounted = False
        _live.discard(self)
        try:
            if _is_mount(self.mountpoint) and not _fusermount_unmount(self.mountpoint,
                                                                      lazy=False):
                _fusermount_unmount(self.mountpoint, lazy=True)
            self._wait_exit()
        finally:
            if self._own_dir is not None:
                with contextlib.suppress(OSError):
                    for child in self._own_dir.iterdir():
                        child.unlink()
                    self._own_dir.rmdir()

    def _wait_exit(self) -> None:
        try:
            self._process.wait(timeout=unmount_timeout_s)
        except subprocess.TimeoutExpired:
            children.end(self._process, timeout_s=unmount_timeout_s)
            if _is_mount(self.mountpoint):
                _fusermount_unmount(self.mountpoint, lazy=True)

    def __enter__(self) -> PowerFs:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.unmount()
