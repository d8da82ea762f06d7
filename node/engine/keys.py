"""RocksDB key layouts, all big-endian so that byte order is numeric order.

messages      stream_id(8) seq(8)                          -> StoredMessage
subjects      stream_id(8) 'i' subject 0x00 seq(8)         -> b""        (per-subject index)
              stream_id(8) 's' subject                     -> count(8) last_seq(8)
dedupe        stream_id(8) msg_id                          -> seq(8) ts_ms(8)
stream_state  name                                         -> StreamRecord
              0x00 "next_stream_id"                        -> u64
consumers     stream_id(8) name                            -> ConsumerRecord

Subjects never contain 0x00 (subjects.py forbids control characters), so the index key of a
subject is never a prefix of another subject's keys.
"""

from __future__ import annotations

import struct

_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")
SEQ_MAX = (1 << 64) - 1
NEXT_STREAM_ID_KEY = b"\x00next_stream_id"
_INDEX = b"i"
_SUMMARY = b"s"


# The packer itself, for loops that pack a seq per message (no Python call around it).
pack_u64 = _U64.pack


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(data: bytes, offset: int = 0) -> int:
    value: int = _U64.unpack_from(data, offset)[0]
    return value


def pair(first: int, second: int) -> bytes:
    return _U64X2.pack(first, second)


def read_pair(data: bytes) -> tuple[int, int]:
    first, second = _U64X2.unpack(data)
    return first, second


def stream_prefix(stream_id: int) -> bytes:
    return _U64.pack(stream_id)


def stream_end(stream_id: int) -> bytes:
    return _U64.pack(stream_id + 1)


def message_key(stream_id: int, seq: int) -> bytes:
    return _U64X2.pack(stream_id, seq)


def message_seq(key: bytes) -> int:
    seq: int = _U64.unpack_from(key, 8)[0]  # not through read_u64: once per message read
    return seq


def index_prefix(stream_id: int, subject: str) -> bytes:
    return _U64.pack(stream_id) + _INDEX + subject.encode() + b"\x00"


def index_key(stream_id: int, subject: str, seq: int) -> bytes:
    return index_prefix(stream_id, subject) + _U64.pack(seq)


def index_seq(key: bytes) -> int:
    return read_u64(key, len(key) - 8)


def summary_prefix(stream_id: int, subject_prefix: str = "") -> bytes:
    return _U64.pack(stream_id) + _SUMMARY + subject_prefix.encode()


def summary_key(stream_id: int, subject: str) -> bytes:
    return summary_prefix(stream_id, subject)


def summary_subject(key: bytes) -> str:
    return key[9:].decode()


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with `prefix`."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\xff" * (len(prefix) + 1)
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def dedupe_key(stream_id: int, msg_id: str) -> bytes:
    return _U64.pack(stream_id) + msg_id.encode()


def dedupe_msg_id(key: bytes) -> str:
    return key[8:].decode()


def consumer_key(stream_id: int, name: str) -> bytes:
    return _U64.pack(stream_id) + name.encode()
