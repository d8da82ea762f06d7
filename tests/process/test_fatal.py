"""base/fatal.py: a write or fsync the disk refused ends the node's process with
EXIT_DISK_FAILED and one critical line, whatever thread it happens on."""

from __future__ import annotations

import subprocess
import sys

from raftlog.base.fatal import EXIT_DISK_FAILED

SCRIPT = """
import logging, threading
from raftlog.base.fatal import fatal_on_disk_failure
logging.basicConfig()
def write():
    with fatal_on_disk_failure("a write to the test's database"):
        raise Exception("IO error: No space left on device")
thread = threading.Thread(target=write)
thread.start()
thread.join()
print("still running")
"""


def test_a_refused_write_ends_the_process_from_any_thread() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == EXIT_DISK_FAILED
    assert "still running" not in done.stdout
    assert "a write to the test's database failed" in done.stderr
    assert "No space left on device" in done.stderr
