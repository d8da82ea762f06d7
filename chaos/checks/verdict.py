"""`check_all`: every checker over one history and what was read after it, combined into a
`Verdict` (anomalies, counts per kind, availability figures, a text table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.availability import (
    Availability,
    check_availability,
    instant_faults_default,
    measure_availability,
)
from raftlog.chaos.checks.calls import acked_writes, indexed
from raftlog.chaos.checks.consumers import ack_floors_backwards, acks_undone
from raftlog.chaos.checks.final import Final
from raftlog.chaos.checks.order import producer_order
from raftlog.chaos.checks.payloads import two_payloads
from raftlog.chaos.checks.primaries import Failover, failovers, split_brain
from raftlog.chaos.checks.reads import stale_reads
from raftlog.chaos.checks.replicas import replicas_differ
from raftlog.chaos.checks.stored import duplicates, gaps, lost
from raftlog.chaos.events import Op

samples_shown = 5  # anomalies listed per kind in a summary

# The summary's rows, in order.
LABELS: dict[Kind, str] = {
    Kind.LOST: "lost", Kind.WRONG_SEQ: "wrong seqs", Kind.DUPLICATE: "duplicates",
    Kind.GAP: "gaps", Kind.TWO_PAYLOADS: "two payloads at a seq",
    Kind.PRODUCER_ORDER: "producer order", Kind.ACK_UNDONE: "acks undone",
    Kind.ACK_FLOOR_BACKWARDS: "ack floors backwards", Kind.SPLIT_BRAIN: "split brain",
    Kind.STALE_READ: "stale reads", Kind.REPLICA_DIFFERS: "replicas differing",
    Kind.REPLICA_MISSING: "replicas missing seqs", Kind.UNAVAILABLE: "unavailable windows",
}


class VerdictFailed(AssertionError):
    """A verdict with anomalies; the message is its summary."""


@dataclass(frozen=True)
class Verdict:
    anomalies: tuple[Anomaly, ...]
    acknowledged: int  # distinct (stream, msg_id) acknowledged
    availability: Availability
    seed: int | None = None
    failovers: tuple[Failover, ...] = ()  # epoch changes seen in the acknowledgements

    def of_kind(self, kind: Kind) -> list[Anomaly]:
        return [anomaly for anomaly in self.anomalies if anomaly.kind is kind]

    def count(self, kind: Kind) -> int:
        return len(self.of_kind(kind))

    def counts(self) -> dict[str, int]:
        """`acknowledged`, then the count of every kind (zeros included)."""
        return {"acknowledged": self.acknowledged, **{str(kind): self.count(kind)
                                                      for kind in Kind}}

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def summary(self) -> str:
        found = {LABELS[kind]: self.count(kind) for kind in Kind if self.count(kind)}
        head = "clean" if self.ok else "FAILED " + ", ".join(f"{label} {count}" for label, count
                                                              in found.items())
        lines = [f"chaos check: {head}", f"  {'kind':<24}{'count':>10}",
                 f"  {'acknowledged':<24}{self.acknowledged:>10}"]
        lines += [f"  {LABELS[kind]:<24}{self.count(kind):>10}" for kind in Kind]
        lines.append(f"  {'failovers (new epochs)':<24}{len(self.failovers):>10}")
        lines += [f"  {line}" for line in self.availability.summary().splitlines()]
        for kind in Kind:
            listed = self.of_kind(kind)
            lines += [f"  {anomaly}" for anomaly in listed[:samples_shown]]
            if len(listed) > samples_shown:
                lines.append(f"  ... {len(listed) - samples_shown} more {LABELS[kind]}")
        if not self.ok and self.seed is not None:
            lines.append(f"  reproduce with seed={self.seed}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        availability = self.availability
        longest = availability.longest
        return {"ok": self.ok, "seed": self.seed, **self.counts(),
                "longest_window_s": None if longest is None else longest.duration_s,
                "recover_s_p50": availability.recover_s_p50,
                "recover_s_max": availability.recover_s_max,
                "unrecovered": availability.unrecovered,
                "majority_cut_s": availability.majority_cut_s,
                "failovers": len(self.failovers)}

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise VerdictFailed(self.summary())


def check_all(history: Sequence[Op], final: Final | None = None, *,
              lease_s: float | None = None, window_s_max: float | None = None,
              uncommitted_reads_allowed: bool = False, across_producers: bool = False,
              instant_faults: frozenset[str] = instant_faults_default,
              seed: int | None = None) -> Verdict:
    """Runs every checker. Without `final` only the history's own rules are checked (order,
    acks, floors, split brain, staleness, two payloads among reads); without `window_s_max`
    availability is measured, never an anomaly. `lease_s` (default the node's
    limits.primary_lease_s): a read started later than this after an ack must see it."""
    final = Final() if final is None else final
    lease_s = limits.primary_lease_s if lease_s is None else lease_s
    history = indexed(history)  # paired once for every checker
    found = [*lost(history, final), *duplicates(history, final), *gaps(final),
             *two_payloads(history, final, uncommitted_reads_allowed=uncommitted_reads_allowed),
             *producer_order(history, across_producers=across_producers),
             *acks_undone(history), *ack_floors_backwards(history), *split_brain(history),
             *stale_reads(history, lease_s=lease_s), *replicas_differ(final)]
    if window_s_max is not None:
        found += check_availability(history, window_s_max=window_s_max)
    acknowledged = len({(write.stream, write.msg_id) for write in acked_writes(history)})
    return Verdict(tuple(found), acknowledged,
                   measure_availability(history, instant_faults=instant_faults), seed,
                   tuple(failovers(history)))
