"""The powerfs process: mounts `PowerFsOperations` with mfusepy (libfuse3, single-threaded
loop), serves the control socket, and unmounts itself when the process that started it dies.

Run as `python -m raftlog.chaos.powerfs --backing DIR --mountpoint DIR --control SOCKET`; it
stays in the foreground until unmounted (`fusermount3 -u MOUNTPOINT`) or sent SIGTERM/SIGINT.
Kernel caches are off (entry, attribute and negative timeouts 0) so that the namespace a `drop`
rebuilds is what the next lookup sees; data pages are cached by the kernel only while a file is
open (no kernel_cache), so a process started after a drop reads the durable bytes.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
from typing import Any

from raftlog.chaos.powerfs.control import ControlServer
from raftlog.chaos.powerfs.faults import FAULT_OPS
from raftlog.chaos.powerfs.fs import PowerFsOperations, dirty_bytes_max_default
from raftlog.chaos.powerfs.install import LIBFUSE_ENV

log = logging.getLogger(__name__)

parent_poll_s = 0.5  # how often the process checks that its parent is alive
unmount_timeout_s = 10.0
FUSE_OPTIONS: dict[str, Any] = {
    "fsname": "powerfs",
    "entry_timeout": 0,
    "attr_timeout": 0,
    "negative_timeout": 0,
    "hard_remove": True,  # unlink an open file for real, not as a .fuse_hidden rename
}


def dispatch(ops: PowerFsOperations, request: dict[str, Any]) -> dict[str, Any]:
    """Runs one control request (see control.py for the protocol)."""
    cmd = request.get("cmd")
    if cmd == "ping":
        return {}
    if cmd == "status":
        return {"status": ops.status()}
    if cmd == "drop":
        return {"report": ops.drop()}
    if cmd == "writeback":
        return {"report": ops.writeback(seed=int(request["seed"]),
                                        fraction=float(request["fraction"]))}
    if cmd == "sync":
        return {"report": ops.sync()}
    if cmd == "full":
        ops.set_full(int(request["bytes_left"]))
        return {}
    if cmd == "eio":
        ops.set_eio(glob=str(request["glob"]), ops=frozenset(request.get("ops", FAULT_OPS)))
        return {}
    if cmd == "ok":
        ops.ok()
        return {}
    raise ValueError(f"unknown command {cmd!r}")


def _unmount_self(mountpoint: str) -> None:
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False,
                   timeout=unmount_timeout_s, capture_output=True)


def _watch_parent(parent_pid: int, mountpoint: str, stop: threading.Event) -> None:
    """Unmounts (which ends the FUSE loop) once `parent_pid` is gone."""
    while not stop.wait(parent_poll_s):
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone: unmounting %s", parent_pid, mountpoint)
            _unmount_self(mountpoint)
            return


def _fuse_class() -> type[Any]:
    for name, value in LIBFUSE_ENV.items():
        os.environ.setdefault(name, value)
    # mfusepy ships no type information (and may be missing where mypy runs)
    import mfusepy  # type: ignore[import-untyped,import-not-found,unused-ignore]

    class Fuse(mfusepy.FUSE):  # type: ignore[misc]
        """mfusepy's FUSE, passing the file handle of an ftruncate (mfusepy 3.1 drops it)."""

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            fh = fip.contents.fh if fip else None
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            result: int = self.operations.truncate(decoded, length, fh)
            return result

    if mfusepy.fuse_version_major != 3:
        raise RuntimeError(f"powerfs needs libfuse 3; mfusepy loaded {mfusepy.fuse_version_major}")
    return Fuse


def serve(*, backing: str, mountpoint: str, control: str, parent_pid: int | None,
          dirty_bytes_max: int) -> None:
    """Mounts and runs until unmounted."""
    os.umask(0)  # modes come from the kernel as the caller asked, already masked
    stop = threading.Event()
    holder: dict[str, ControlServer] = {}

    def on_init() -> None:
        server = ControlServer(control, lambda request: dispatch(ops, request))
        server.start()
        holder["server"] = server
        if parent_pid is not None:
            threading.Thread(target=_watch_parent, args=(parent_pid, mountpoint, stop),
                             name="powerfs-parent", daemon=True).start()
        log.info("powerfs mounted %s over %s, control %s", mountpoint, backing, control)

    def on_destroy() -> None:
        stop.set()
        if "server" in holder:
            holder["server"].stop()

    ops = PowerFsOperations(backing, dirty_bytes_max=dirty_bytes_max, on_init=on_init,
                            on_destroy=on_destroy)
    _fuse_class()(ops, mountpoint, foreground=True, nothreads=True, **FUSE_OPTIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftlog.chaos.powerfs",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backing", required=True, help="directory that holds durable state")
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--control", required=True, help="path of the control UNIX socket")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="unmount when this process (the parent) is gone")
    parser.add_argument("--dirty-bytes-max", type=int, default=dirty_bytes_max_default,
                        help="unsynced bytes held in memory before the oldest are written back")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s powerfs %(levelname)s %(name)s: %(message)s")
    serve(backing=args.backing, mountpoint=args.mountpoint, control=args.control,
          parent_pid=args.parent_pid, dirty_bytes_max=args.dirty_bytes_max)
    return 0
