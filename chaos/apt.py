"""Installing a system package the harness needs (fuse3 for the power-loss file system,
iptables for separate hosts): `apt-get install -y`, after one `apt-get update` if the first
try fails on a stale package list. Root only; callers check that and say what to run
otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

apt_timeout_s = 300.0  # one apt-get call


def _apt(*args: str) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        result = subprocess.run(["apt-get", *args], env=env, capture_output=True, check=False,
                                stdin=subprocess.DEVNULL, timeout=apt_timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def apt_install(package: str, *, commands: Sequence[str]) -> str | None:
    """Installs `package`; None once one of `commands` is on PATH, else why not."""
    missing = f"{commands[0]} is missing"
    if shutil.which("apt-get") is None:
        return f"{missing} and there is no apt-get: install the {package} package"
    if not _apt("install", "-y", package):
        _apt("update")
        if not _apt("install", "-y", package):
            return f"{missing} and `apt-get install -y {package}` failed"
    if not any(shutil.which(command) for command in commands):
        return f"`apt-get install -y {package}` ran but {commands[0]} is still not on PATH"
    return None
