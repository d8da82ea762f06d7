"""Where an export reads from: a node's RocksDB opened for reading only.

The source is a stopped node's data directory (DIR/db, DIR/raft/snapshot.pb) or a checkpoint
directory a running node made for an online export (same layout). Nothing under it is written:

- RocksDB is opened read-only (its WAL replayed in memory), through a private directory of
  symbolic links to the database's files: rocksdict rewrites its own config file at every open,
  even a read-only one, so that file is copied there instead.
- A database another process holds open is refused (`DatabaseInUse`): RocksDB holds an fcntl
  lock on its LOCK file while it runs, and a read-only open would neither see its latest writes
  nor be safe from its compactions. Export a running node online (`--cluster`).
  The check takes a shared lock for a moment; POSIX drops a process's locks on a file when it
  closes any descriptor of it, so never call this in the process that has the database open.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from raftlog.node.engine.storage import COLUMN_FAMILIES

DB_DIR = "db"
SNAPSHOT_FILE = Path("raft") / "snapshot.pb"  # under the data directory (node/server.py)
_LOCK_FILE = "LOCK"
_ROCKSDICT_CONFIG = "rocksdict-config.json"
_NOT_LINKED = (_LOCK_FILE, _ROCKSDICT_CONFIG)


class SourceError(Exception):
    """The directory is not a node's database, or cannot be read now."""


class DatabaseInUse(SourceError):
    """A running process holds the database."""


@dataclass(frozen=True)
class NodeFiles:
    db_dir: Path
    snapshot: Path | None  # the metadata snapshot file; None when the node has none


def locate(path: Path) -> NodeFiles:
    """A data directory (holding db/) or a database directory itself."""
    db_dir = path / DB_DIR if (path / DB_DIR).is_dir() else path
    if not (db_dir / "CURRENT").is_file():
        raise SourceError(f"{path}: no RocksDB database here (expected {path / DB_DIR})")
    snapshot = db_dir.parent / SNAPSHOT_FILE if db_dir.name == DB_DIR else None
    return NodeFiles(db_dir=db_dir,
                     snapshot=snapshot if snapshot is not None and snapshot.is_file() else None)


def check_not_in_use(db_dir: Path) -> None:
    """Raises DatabaseInUse when a process holds the database's lock."""
    try:
        fd = os.open(db_dir / _LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        raise DatabaseInUse(
            f"{db_dir} is in use by a running node (its RocksDB lock is held): stop the node "
            "first, or export it online with --cluster") from None
    finally:
        os.close(fd)


class ReadOnlyDb:
    """The column families of a database opened read-only; `close()` when done."""

    def __init__(self, db: Rdict, scratch: Path) -> None:
        self._db = db
        self._scratch = scratch
        self._views = {name: db.get_column_family(name) for name in COLUMN_FAMILIES}

    def cf(self, name: str) -> Rdict:
        return self._views[name]

    def close(self) -> None:
        self._views.clear()
        self._db.close()
        shutil.rmtree(self._scratch, ignore_errors=True)


@contextlib.contextmanager
def open_read_only(db_dir: Path) -> Iterator[ReadOnlyDb]:
    scratch = Path(tempfile.mkdtemp(prefix="raftlog-audit-db."))
    try:
        view = scratch / DB_DIR
        view.mkdir()
        for name in os.listdir(db_dir):
            if name == _ROCKSDICT_CONFIG:
                shutil.copyfile(db_dir / name, view / name)
            elif name not in _NOT_LINKED and not name.startswith("LOG"):
                (view / name).symlink_to((db_dir / name).resolve())
        db = Rdict(str(view), Options(raw_mode=True),
                   column_families={name: Options(raw_mode=True) for name in COLUMN_FAMILIES},
                   access_type=AccessType.read_only(False))
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    opened = ReadOnlyDb(db, scratch)
    try:
        yield opened
    finally:
        opened.close()
