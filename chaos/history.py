"""What a workload records, and how its messages carry their identity: the histories a
`Publisher` (`PublishHistory` of `Attempt`s and `Ack`s) and a `Consumer` (`ConsumeHistory` of
`Delivery`s and `AckDone`s) fill in, the payload codec (`wl1|<msg_id>|<filler>`, so a copy
stored without its msg_id field or under another seq is still recognised) and the seed
(`seed_from_env`). Part of the workload (chaos/workload.py re-exports it).
"""

from __future__ import annotations

import collections
import os
import random
from dataclasses import dataclass, field

from raftlog.v1 import consumers_pb2

SEED_ENV = "RAFTLOG_WORKLOAD_SEED"
PAYLOAD_MAGIC = b"wl1"


def seed_from_env(default: int | None = None) -> int:
    """$RAFTLOG_WORKLOAD_SEED, else `default`, else a fresh random seed."""
    text = os.environ.get(SEED_ENV, "")
    if text:
        return int(text, 0)
    return default if default is not None else random.SystemRandom().randrange(2**32)


def encode_payload(*, msg_id: str, size_bytes: int, rng: random.Random) -> bytes:
    head = PAYLOAD_MAGIC + b"|" + msg_id.encode() + b"|"
    filler = max(0, size_bytes - len(head))
    return head + bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=filler))


def decode_payload(payload: bytes) -> str | None:
    """The msg_id a workload payload carries, or None when it is not one."""
    parts = payload.split(b"|", 2)
    if len(parts) < 3 or parts[0] != PAYLOAD_MAGIC:
        return None
    return parts[1].decode(errors="replace")


@dataclass(frozen=True)
class Attempt:
    """One message in one call. `seq` is 0 unless the call acknowledged the message."""

    msg_id: str
    node: str
    sent_at: float
    done_at: float
    seq: int = 0
    duplicate: bool = False
    error: str = ""
    epoch: int = 0  # the acknowledging primary's fencing epoch and node id (0, "": unknown)
    primary: str = ""


@dataclass(frozen=True)
class Ack:
    """An acknowledged publish: the server said msg_id is stored at seq."""

    msg_id: str
    seq: int
    duplicate: bool
    sent_at: float
    acked_at: float
    node: str


@dataclass
class PublishHistory:
    name: str
    stream: str
    seed: int
    sent: list[str] = field(default_factory=list)  # msg_ids in first-send order
    subjects: set[str] = field(default_factory=set)
    attempts: list[Attempt] = field(default_factory=list)
    acked: dict[str, Ack] = field(default_factory=dict)
    stopped_by: str = ""  # count | time | stop | fatal
    fatal_error: str = ""

    @property
    def unacked(self) -> list[str]:
        return [msg_id for msg_id in self.sent if msg_id not in self.acked]

    def errors(self) -> collections.Counter[str]:
        return collections.Counter(a.error for a in self.attempts if a.error)


@dataclass(frozen=True)
class Delivery:
    seq: int
    msg_id: str  # from the payload (the msg_id field when the payload is not a workload's)
    deliver_count: int
    fetch_sent_at: float
    received_at: float
    node: str


@dataclass(frozen=True)
class AckDone:
    """An Ack call the server answered OK: these seqs are acknowledged from `acked_at` on."""

    seqs: tuple[int, ...]
    sent_at: float
    acked_at: float
    node: str


@dataclass
class ConsumeHistory:
    name: str
    stream: str
    deliveries: list[Delivery] = field(default_factory=list)
    acks: list[AckDone] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    drained: bool = False  # ended with nothing pending and nothing awaiting ack
    stopped_by: str = ""  # stop | drained | time | limit
    final_state: consumers_pb2.ConsumerState | None = None
