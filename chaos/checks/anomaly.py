"""What a checker reports: an `Anomaly` of one `Kind`, with a description a person can act on
and the ops (and seqs, nodes) involved. Every checker returns a list of them; an empty list is
a clean result."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftlog.chaos.events import Op


class Kind(enum.StrEnum):
    """The catalogue of anomalies; values are stable (they appear in reports and JSON)."""

    LOST = "lost"  # acknowledged, absent from the final contents
    WRONG_SEQ = "wrong-seq"  # acknowledged at one seq, stored at another
    DUPLICATE = "duplicate"  # one msg_id stored at more than one seq
    GAP = "gap"  # seqs missing between first_seq and last_seq
    TWO_PAYLOADS = "two-payloads"  # one seq seen holding different messages
    PRODUCER_ORDER = "producer-order"  # a producer's later message at a lower seq
    ACK_UNDONE = "ack-undone"  # delivered again after its ack was acknowledged
    ACK_FLOOR_BACKWARDS = "ack-floor-backwards"
    SPLIT_BRAIN = "split-brain"  # two acknowledgers in one epoch, or two messages at one seq
    STALE_READ = "stale-read"  # a read (or probe) that missed an acknowledged write
    REPLICA_DIFFERS = "replica-differs"  # replicas hold different bytes at one seq
    REPLICA_MISSING = "replica-missing"  # a replica lacks part of the committed prefix
    UNAVAILABLE = "unavailable"  # no acknowledged write for too long with a majority up


@dataclass(frozen=True)
class Anomaly:
    """`seqs` are the seqs concerned (for a gap: its first and last); `nodes` the nodes."""

    kind: Kind
    description: str
    ops: tuple[Op, ...] = ()
    stream: str = ""
    seqs: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def op_indexes(self) -> tuple[int, ...]:
        return tuple(op.index for op in self.ops)

    def __str__(self) -> str:
        named = f" (ops {', '.join(map(str, self.op_indexes))})" if self.ops else ""
        return f"{self.kind}: {self.description}{named}"
