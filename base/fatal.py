"""A write or fsync the disk refused is fatal to the node: after it, the node cannot tell what
its memory holds that the disk does not (a message it accepted, a seq it moved past), so going
on could acknowledge what is not stored or leave a hole in a replica. It exits instead, as
PostgreSQL does on a failed fsync, and starts again from what is on disk: its peers fill in
what it lacks, its streams fail over meanwhile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

EXIT_DISK_FAILED = 70  # the node's exit status after a refused write or fsync (EX_SOFTWARE)


@contextmanager
def fatal_on_disk_failure(what: str) -> Iterator[None]:
    """Runs the body; any exception it raises (RocksDB reports I/O errors, ENOSPC included, as
    plain exceptions) ends the process with EXIT_DISK_FAILED after one critical log line."""
    try:
        yield
    except Exception:
        log.critical("%s failed; exiting so that nothing more is acknowledged (the node starts "
                     "again from what is on disk)", what, exc_info=True)
        os._exit(EXIT_DISK_FAILED)
