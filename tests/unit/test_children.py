"""base/children.py: ending a child this process started."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from raftlog.base import children

timeout_s = 10.0  # any one child ends well within this


def _child(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"  # its signal handlers are in place
    return process


def test_a_child_that_heeds_sigterm_ends_with_it() -> None:
    process = _child("import time; print('ready', flush=True); time.sleep(60)")
    assert children.end(process, timeout_s=timeout_s) == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    process = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                     "print('ready', flush=True); time.sleep(60)")
    started = time.monotonic()
    assert children.end(process, timeout_s=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < timeout_s


def test_a_child_that_has_exited_is_only_reaped() -> None:
    process = _child("print('ready', flush=True)")
    assert process.wait(timeout_s) == 0
    assert children.end(process, timeout_s=timeout_s) == 0
