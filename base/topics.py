"""Topics: a name for N partition streams. Pure functions only: the topic name rules, the
reversible stream name of each partition, and the key -> partition hash front-ends share.

A topic name is 1+ of [A-Za-z0-9._-] (Kafka's and RocketMQ's alphabet); a stream name may not
hold '.', so partition `i` of topic `t` is the stream

    TOPIC_<escape(t)>_p<i>        escape: '_' -> '__', '.' -> '_d', every other byte kept

Decoding reads '_' as the start of a pair ('__', '_d', or '_p' + the index, which ends the
name), so every partition has exactly one stream name and every such name one (topic, index).
The index is written in decimal without leading zeros. Every stream name that starts with
`TOPIC_` is reserved: only a partition stream, whose config names the same (topic, index),
may carry it (node/engine/stream_config.py refuses the rest), so a plain stream never collides
with a partition.
"""

from __future__ import annotations

import re

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason

PARTITION_PREFIX = "TOPIC_"
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_INDEX_RE = re.compile(r"0|[1-9][0-9]*")

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def validate_topic(name: str) -> str:
    """Checks a topic name; returns it or raises INVALID_NAME."""
    if not name:
        raise RaftlogError(Reason.INVALID_NAME, "topic name is empty")
    if len(name.encode()) > limits.topic_name_bytes_max:
        raise RaftlogError(Reason.INVALID_NAME, f"topic name is longer than "
                           f"{limits.topic_name_bytes_max} bytes",
                           limit=limits.topic_name_bytes_max)
    if not _TOPIC_RE.fullmatch(name):
        raise RaftlogError(Reason.INVALID_NAME, f"topic name {name!r} may only contain "
                           "letters, digits, '.', '_' and '-'")
    return name


def validate_partitions(count: int) -> int:
    """Checks a partition count; returns it or raises INVALID_ARGUMENT."""
    if not 1 <= count <= limits.topic_partitions_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"a topic has 1 to "
                           f"{limits.topic_partitions_max} partitions, not {count}",
                           field="partitions", limit=limits.topic_partitions_max)
    return count


def partition_stream(topic: str, index: int) -> str:
    """The stream name of partition `index` of `topic` (both checked by the caller)."""
    escaped = topic.replace("_", "__").replace(".", "_d")
    return f"{PARTITION_PREFIX}{escaped}_p{index}"


def parse_partition_stream(stream: str) -> tuple[str, int] | None:
    """(topic, index) when `stream` is the canonical name of a partition; else None."""
    if not stream.startswith(PARTITION_PREFIX):
        return None
    rest = stream[len(PARTITION_PREFIX):]
    topic: list[str] = []
    at = 0
    while at < len(rest):
        char = rest[at]
        if char != "_":
            topic.append(char)
            at += 1
            continue
        pair = rest[at + 1:at + 2]
        if pair == "_":
            topic.append("_")
        elif pair == "d":
            topic.append(".")
        elif pair == "p" and topic and _INDEX_RE.fullmatch(rest[at + 2:]):
            return "".join(topic), int(rest[at + 2:])
        else:
            return None
        at += 2
    return None


def is_reserved(stream: str) -> bool:
    """True when `stream` is in the form kept for partition streams."""
    return stream.startswith(PARTITION_PREFIX)


def fnv1a_32(data: bytes) -> int:
    """The 32-bit FNV-1a hash of `data`, unsigned."""
    value = _FNV32_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return value


def hash_partition(key: bytes, partitions: int) -> int:
    """sarama's HashPartitioner for a present key: int32(fnv1a_32(key)) % n, made
    non-negative by negation (Go's `%` keeps the dividend's sign)."""
    signed = fnv1a_32(key)
    if signed >= 1 << 31:
        signed -= 1 << 32
    remainder = abs(signed) % partitions  # Go: the remainder takes the dividend's sign
    return remainder
