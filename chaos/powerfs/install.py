"""Whether this machine can mount powerfs, and the one install step the harness may take itself:
`apt-get install -y fuse3` when running as root (after one `apt-get update` if the install
fails on a stale package list). Everything else is reported, with what to run.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

from raftlog.chaos.apt import apt_install

FUSE_DEVICE = "/dev/fuse"
probe_timeout_s = 30.0
# mfusepy prefers libfuse 2 when both are installed; powerfs is written against libfuse 3.
LIBFUSE_ENV = {"FUSE_LIBRARY_NAME": "fuse3"}


def _install_fuse3() -> str | None:
    """Installs fuse3 as root; returns None on success, else why not."""
    return apt_install("fuse3", commands=("fusermount3",))


@functools.cache
def ensure_fuse() -> str | None:
    """None when powerfs can mount here; otherwise the reason and what to run. Installs fuse3
    with apt-get when root and fusermount3 is missing (once per process)."""
    root = os.geteuid() == 0
    if not os.path.exists(FUSE_DEVICE):
        return (f"{FUSE_DEVICE} is missing: run `modprobe fuse` as root (in a container, start "
                "it with `--device /dev/fuse --cap-add SYS_ADMIN`)")
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        return (f"{FUSE_DEVICE} is not readable and writable by uid {os.geteuid()}: run the "
                "harness as root, or add this user to the group that owns it")
    if shutil.which("fusermount3") is None:
        if not root:
            return "fusermount3 is missing: run `sudo apt-get install -y fuse3`"
        reason = _install_fuse3()
        if reason is not None:
            return reason
    return _check_mfusepy()


def _check_mfusepy() -> str | None:
    """Imports mfusepy in a child process the way the powerfs process does (libfuse3 pinned)."""
    probe = "import mfusepy; print(mfusepy.fuse_version_major)"
    env = {**os.environ, **LIBFUSE_ENV}
    try:
        result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                text=True, check=False, timeout=probe_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"could not run {sys.executable} to import mfusepy: {error}"
    if "ModuleNotFoundError" in result.stderr:
        return f"mfusepy is not installed: run `{sys.executable} -m pip install mfusepy`"
    if result.returncode != 0:
        last = result.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"mfusepy cannot load libfuse3 ({last[0]}): run `apt-get install -y fuse3`"
    if result.stdout.strip() != "3":
        return f"mfusepy loaded libfuse {result.stdout.strip()}, not 3: install fuse3"
    return None
