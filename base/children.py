"""Ending a child process this process started, through its Popen (so by its own pid, never a
reused one): the benchmarks' servers and sidecars, the chaos tools, the tests' helpers."""

from __future__ import annotations

import subprocess
from typing import Any


def end(process: subprocess.Popen[Any], *, timeout_s: float) -> int:
    """SIGTERM, up to `timeout_s` for the child to exit, then SIGKILL and up to `timeout_s`
    more; returns its exit status. A child that has exited already is only reaped.
    subprocess.TimeoutExpired when even SIGKILL did not end it in time."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout_s)
