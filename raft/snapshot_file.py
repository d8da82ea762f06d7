"""The snapshot file of the metadata group: an encoded `RaftSnapshot` behind a magic line and
a header (CRC-32 and length of the payload), written and read with fsyncs.

pysyncobj ships this file to lagging followers in chunks and renames it into place itself; the
group fsyncs the directory after that rename (`fsync_directory`). Reading fsyncs too: a file just
received must be durable before the journal it replaces is cleared.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from raftlog.base.errors import RaftlogError, Reason
from raftlog.base.files import fsync_dir
from raftlog.internal import raft_pb2

_SNAPSHOT_MAGIC = b"RLSNAP1\n"
_SNAPSHOT_HEADER = struct.Struct(">II")  # crc32 of the payload, payload length


def write_snapshot_file(path: str, payload: bytes) -> int:
    """Writes an encoded RaftSnapshot with its header and fsyncs the file; returns its inode."""
    with open(path, "wb") as file:
        file.write(_SNAPSHOT_MAGIC + _SNAPSHOT_HEADER.pack(zlib.crc32(payload), len(payload)))
        file.write(payload)
        file.flush()
        os.fsync(file.fileno())
        return os.fstat(file.fileno()).st_ino


def read_snapshot_file(path: str, *, durable: bool = True) -> raft_pb2.RaftSnapshot:
    """Reads, checks and, when `durable`, fsyncs (a snapshot just received must be durable
    before the journal it replaces is cleared; a reader that changes nothing passes False).
    Raises RaftlogError(CORRUPT_RECORD) on a bad file."""
    with open(path, "rb") as file:
        raw = file.read()
        if durable:
            os.fsync(file.fileno())
    if durable:
        fsync_directory(os.path.dirname(os.path.abspath(path)))
    header_end = len(_SNAPSHOT_MAGIC) + _SNAPSHOT_HEADER.size
    if len(raw) < header_end or not raw.startswith(_SNAPSHOT_MAGIC):
        raise RaftlogError(Reason.CORRUPT_RECORD, f"{path}: not a raftlog snapshot")
    crc, length = _SNAPSHOT_HEADER.unpack(raw[len(_SNAPSHOT_MAGIC):header_end])
    payload = raw[header_end:]
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise RaftlogError(Reason.CORRUPT_RECORD, f"{path}: snapshot is truncated or corrupt")
    return raft_pb2.RaftSnapshot.FromString(payload)


def fsync_directory(path: str) -> None:
    fsync_dir(Path(path))
