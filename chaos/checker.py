"""The workload's verdicts, pure (histories and collected state in, a `Report` out): `check`
reports acknowledged messages missing or at another seq than acknowledged, duplicates, gaps,
deliveries of messages that are not stored (uncommitted reads), acks acknowledged and then
undone, and replicas that differ on the committed prefix; a failed report prints `reproduce with
seed=...`. `audit` collects (collect.py) and checks. `failover_timing` measures the time from a
fault to the first acknowledged publish after it. Part of the workload (chaos/workload.py
re-exports it).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raftlog.chaos.checks.replicas import runs
from raftlog.chaos.clients import PeerAccess
from raftlog.chaos.collect import (
    ReplicaCopy,
    ReplicaSurvey,
    StreamContents,
    read_replicas,
    read_stream,
    wait_replicas_converged,
)
from raftlog.chaos.history import (
    SEED_ENV,
    Attempt,
    ConsumeHistory,
    Delivery,
    PublishHistory,
    decode_payload,
)
from raftlog.internal import storage_pb2

samples_shown = 10  # violations listed per kind in a summary


@dataclass(frozen=True)
class WrongSeq:
    msg_id: str
    acked_seq: int
    stored_seqs: tuple[int, ...]


@dataclass(frozen=True)
class AckUndone:
    """`seq`'s ack was acknowledged at `acked_at`, yet a fetch sent later delivered it."""

    consumer: str
    seq: int
    acked_at: float
    redelivered_fetch_sent_at: float
    deliver_count: int


@dataclass(frozen=True)
class Divergence:
    seq: int
    kind: str  # missing | differs | api-differs
    nodes: tuple[str, ...]  # the nodes that disagree with the first copy (or lack the seq)


@dataclass
class Report:
    seed: int
    stream: str
    acked: int = 0
    present: int = 0  # acknowledged messages found at their seq
    acked_missing: list[str] = field(default_factory=list)
    acked_wrong_seq: list[WrongSeq] = field(default_factory=list)
    duplicates: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # inclusive seq ranges
    corrupt: list[int] = field(default_factory=list)  # msg_id field disagrees with the payload
    delivered_not_stored: list[Delivery] = field(default_factory=list)
    acks_undone: list[AckUndone] = field(default_factory=list)
    ack_floor_behind: list[tuple[str, int, int]] = field(default_factory=list)
    undelivered: list[tuple[str, int]] = field(default_factory=list)
    divergence: list[Divergence] = field(default_factory=list)
    replicas_compared: int = 0
    replicas_required: int = 0
    committed_prefix: int = 0
    unacked_present: int = 0  # not acknowledged yet stored (ambiguous, not a violation)
    unacked_absent: int = 0
    notes: list[str] = field(default_factory=list)

    VIOLATIONS = ("acked_missing", "acked_wrong_seq", "duplicates", "gaps", "corrupt",
                  "delivered_not_stored", "acks_undone", "ack_floor_behind", "undelivered",
                  "divergence")

    def violations(self) -> dict[str, int]:
        """Count per kind of violation found; `replicas_short` when fewer copies were compared
        than required."""
        found = {name: len(getattr(self, name)) for name in self.VIOLATIONS}
        found["replicas_short"] = max(0, self.replicas_required - self.replicas_compared)
        return {name: count for name, count in found.items() if count}

    @property
    def ok(self) -> bool:
        return not self.violations()

    def summary(self) -> str:
        lines = [f"workload check of stream {self.stream!r}: "
                 f"{'clean' if self.ok else 'FAILED ' + str(self.violations())}",
                 f"  acked {self.acked}, present {self.present}, unacked present "
                 f"{self.unacked_present} / absent {self.unacked_absent}; replicas compared "
                 f"{self.replicas_compared} (required {self.replicas_required}) through seq "
                 f"{self.committed_prefix}"]
        for name in self.VIOLATIONS:
            values = getattr(self, name)
            if values:
                shown = ", ".join(str(v) for v in values[:samples_shown])
                hidden = len(values) - samples_shown
                more = f" (+{hidden} more)" if hidden > 0 else ""
                lines.append(f"  {name}: {shown}{more}")
        lines += [f"  note: {note}" for note in self.notes]
        if not self.ok:
            lines.append(f"  reproduce with seed={self.seed} ({SEED_ENV}={self.seed})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        counts = {name: len(getattr(self, name)) for name in self.VIOLATIONS}
        return {"ok": self.ok, "seed": self.seed, "stream": self.stream, "acked": self.acked,
                "present": self.present, **counts, "unacked_present": self.unacked_present,
                "unacked_absent": self.unacked_absent,
                "replicas_compared": self.replicas_compared,
                "committed_prefix": self.committed_prefix, "notes": self.notes}

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise CheckFailed(self.summary())


class CheckFailed(AssertionError):
    """A workload check found a violation; the message is the report's summary."""


def check(*, seed: int, contents: StreamContents, published: Sequence[PublishHistory] = (),
          consumed: Sequence[ConsumeHistory] = (), replicas: ReplicaSurvey | None = None,
          replicas_required: int = 0, full_prefix: bool = False, quiet: bool = False) -> Report:
    """Checks the histories against the stream's contents and the replicas against each other.

    Replicas are compared on seqs from the highest head to the committed prefix: the lowest
    commit_seq among the copies, or with `full_prefix` the primary's commit_seq (then a copy
    that lacks a seq below it counts as divergence: use it after `wait_replicas_converged`).
    Prints the summary, with the seed to reproduce, to stderr when the check fails."""
    report = Report(seed=seed, stream=contents.stream, replicas_required=replicas_required)
    report.notes += contents.notes
    if contents.commit_seq and contents.last_seq > contents.commit_seq:
        report.notes.append(f"last seq {contents.last_seq} above commit seq {contents.commit_seq}")
    seqs_by_id = _seqs_by_id(contents, report)
    _check_publishes(report, published, contents, seqs_by_id)
    report.duplicates = [(msg_id, tuple(seqs)) for msg_id, seqs in seqs_by_id.items()
                         if len(seqs) > 1]
    report.gaps = list(runs(seq for seq in range(contents.first_seq,
                                                    contents.visible_last_seq + 1)
                               if seq not in contents.messages))
    for history in _by_consumer(consumed):
        _check_consumer(report, history, contents)
    if replicas is not None:
        _check_replicas(report, replicas, contents, full_prefix=full_prefix)
    if not report.ok and not quiet:
        print(report.summary(), file=sys.stderr)
    return report


def _seqs_by_id(contents: StreamContents, report: Report) -> dict[str, list[int]]:
    seqs_by_id: dict[str, list[int]] = collections.defaultdict(list)
    for seq in sorted(contents.messages):
        view = contents.messages[seq]
        if view.payload_id is None:
            report.notes.append(f"seq {seq}: not a workload payload")
            continue
        if view.msg_id and view.msg_id != view.payload_id:
            report.corrupt.append(seq)
        seqs_by_id[view.payload_id].append(seq)
    return seqs_by_id


def _check_publishes(report: Report, published: Sequence[PublishHistory],
                     contents: StreamContents, seqs_by_id: dict[str, list[int]]) -> None:
    for history in published:
        for msg_id, ack in history.acked.items():
            report.acked += 1
            seqs = seqs_by_id.get(msg_id, [])
            if not seqs:
                report.acked_missing.append(msg_id)
            elif ack.seq not in seqs:
                report.acked_wrong_seq.append(WrongSeq(msg_id, ack.seq, tuple(seqs)))
            else:
                report.present += 1
        for msg_id in history.unacked:
            if msg_id in seqs_by_id:
                report.unacked_present += 1
            else:
                report.unacked_absent += 1


def _by_consumer(histories: Sequence[ConsumeHistory]) -> list[ConsumeHistory]:
    """One history per durable consumer: clients of the same consumer are merged (an ack
    acknowledged to one client must not come back to another)."""
    merged: dict[str, ConsumeHistory] = {}
    for history in histories:
        into = merged.setdefault(history.name, ConsumeHistory(name=history.name,
                                                              stream=history.stream))
        into.deliveries += history.deliveries
        into.acks += history.acks
        into.errors.update(history.errors)
        if history.drained or into.final_state is None:
            into.final_state = history.final_state
        into.drained = into.drained or history.drained
    return list(merged.values())


def _check_consumer(report: Report, history: ConsumeHistory, contents: StreamContents) -> None:
    first_acked_at: dict[int, float] = {}
    for ack in history.acks:
        for seq in ack.seqs:
            first_acked_at[seq] = min(first_acked_at.get(seq, ack.acked_at), ack.acked_at)
    delivered: set[int] = set()
    for delivery in history.deliveries:
        delivered.add(delivery.seq)
        view = contents.messages.get(delivery.seq)
        stored_id = None if view is None else (view.payload_id or view.msg_id)
        below_head = delivery.seq < contents.first_seq
        if not below_head and stored_id != delivery.msg_id:
            report.delivered_not_stored.append(delivery)
        acked_at = first_acked_at.get(delivery.seq)
        if acked_at is not None and delivery.fetch_sent_at > acked_at:
            report.acks_undone.append(AckUndone(history.name, delivery.seq, acked_at,
                                                delivery.fetch_sent_at, delivery.deliver_count))
    acked_prefix = 0
    while acked_prefix + 1 in first_acked_at:
        acked_prefix += 1
    state = history.final_state
    if state is not None and state.ack_floor < acked_prefix:
        report.ack_floor_behind.append((history.name, int(state.ack_floor), acked_prefix))
    if history.drained:
        report.undelivered += [(history.name, seq) for seq in sorted(contents.messages)
                               if seq not in delivered]


def _check_replicas(report: Report, survey: ReplicaSurvey, contents: StreamContents, *,
                    full_prefix: bool) -> None:
    report.notes += survey.notes
    copies = survey.copies
    report.replicas_compared = len(copies)
    if not copies:
        return
    primary_commit = survey.primary_commit_seq
    if full_prefix and primary_commit is None:
        report.notes.append(f"primary {survey.primary or '?'} has no copy; using the lowest "
                            "commit seq")
    prefix = (primary_commit if full_prefix and primary_commit is not None
              else min(copy.commit_seq for copy in copies))
    report.committed_prefix = prefix
    low = max(copy.first_seq for copy in copies)
    for seq in range(low, prefix + 1):
        _compare_seq(report, seq, copies, contents)


def _compare_seq(report: Report, seq: int, copies: Sequence[ReplicaCopy],
                 contents: StreamContents) -> None:
    lacking = tuple(copy.node for copy in copies if seq not in copy.stored)
    if lacking:
        report.divergence.append(Divergence(seq, "missing", lacking))
    held = [copy for copy in copies if seq in copy.stored]
    if not held:
        return
    reference = held[0].stored[seq]
    differing = tuple(copy.node for copy in held[1:] if copy.stored[seq] != reference)
    if differing:
        report.divergence.append(Divergence(seq, "differs", (held[0].node, *differing)))
    view = contents.messages.get(seq)
    if view is not None and _stored_id(reference) != (view.payload_id or view.msg_id):
        report.divergence.append(Divergence(seq, "api-differs", (held[0].node,)))


def _stored_id(stored: bytes) -> str:
    message = storage_pb2.StoredMessage.FromString(stored)
    return decode_payload(message.payload) or message.msg_id


async def audit(addresses: Sequence[str], stream: str, *, seed: int,
                published: Sequence[PublishHistory] = (), consumed: Sequence[ConsumeHistory] = (),
                replicas_required: int = 0, converge_timeout_s: float = 10.0,
                quiet: bool = False, peer: PeerAccess | None = None) -> Report:
    """Collects (after waiting up to `converge_timeout_s` for the replicas to agree on their
    last seq) and checks. With replicas_required > 0 the full primary prefix is compared;
    that needs `peer` (the nodes' peer listeners and the cluster credential)."""
    converged = replicas_required == 0 or await wait_replicas_converged(
        addresses, stream, copies_min=replicas_required, timeout_s=converge_timeout_s,
        peer=peer)
    contents = await read_stream(addresses, stream)
    survey = await read_replicas(addresses, stream, peer=peer)
    if not converged:
        survey.notes.append(f"{replicas_required} replicas did not agree on one last and commit "
                            f"seq within {converge_timeout_s} s")
    return check(seed=seed, contents=contents, published=published, consumed=consumed,
                 replicas=survey, replicas_required=replicas_required,
                 full_prefix=replicas_required > 0, quiet=quiet)


@dataclass(frozen=True)
class FailoverTiming:
    """Seconds, measured on the publishers' clock from `fault_at` (just before the signal)."""

    fault_at: float
    recover_s: float | None  # to the ack of the first publish SENT after the fault
    first_ack_s: float | None  # to the first ack RECEIVED after the fault (any send time)
    outage_s: float | None  # from the last ack before the fault to the first one after it
    max_ack_gap_s: float  # the largest gap between consecutive acks in the histories
    acked_before: int
    acked_after: int

    def to_dict(self) -> dict[str, Any]:
        return {key: (round(value, 4) if isinstance(value, float) else value)
                for key, value in dataclasses.asdict(self).items()}


def _first_ack_sent_after(attempts: Sequence[Attempt], at: float) -> float | None:
    times = [a.done_at - at for a in attempts if a.seq and a.sent_at >= at]
    return min(times, default=None)


def failover_timing(histories: Sequence[PublishHistory], *, fault_at: float) -> FailoverTiming:
    attempts = [a for history in histories for a in history.attempts]
    ack_times = sorted({a.done_at for a in attempts if a.seq})
    before = [t for t in ack_times if t < fault_at]
    after = [t for t in ack_times if t >= fault_at]
    gaps = [later - earlier for earlier, later in itertools.pairwise(ack_times)]
    return FailoverTiming(
        fault_at=fault_at,
        recover_s=_first_ack_sent_after(attempts, fault_at),
        first_ack_s=(after[0] - fault_at) if after else None,
        outage_s=(after[0] - before[-1]) if after and before else None,
        max_ack_gap_s=max(gaps, default=0.0),
        acked_before=sum(1 for a in attempts if a.seq and a.done_at < fault_at),
        acked_after=sum(1 for a in attempts if a.seq and a.done_at >= fault_at),
    )
