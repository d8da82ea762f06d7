"""What a chaos run recorded, as one history (chaos/events.py) and the final state the
checkers take (chaos/checks/final.py).

The workload's drivers keep their own records (history.py: each call's send and answer times,
the node called, the outcome); `to_history` turns them, the reader's reads and the nemesis
windows into ops in real-time order: a publisher's calls as `publish`/`publish_batch`, the
prober's as `probe`, a consumer's fetches and acks, each fault's start and stop. An error of
a call is an `info` completion (its outcome unknown), never a `fail`: the checkers then never
count on a write having not happened.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from raftlog.chaos.checks.final import Final, FinalContents, ReplicaCopies
from raftlog.chaos.collect import ReplicaSurvey, StreamContents
from raftlog.chaos.events import (
    Op,
    OpType,
    Seen,
    ack_value,
    fetch_value,
    probe_value,
    publish_value,
    read_value,
)
from raftlog.chaos.history import Attempt, ConsumeHistory, PublishHistory

PROBE_NAME = "probe"


@dataclass(frozen=True)
class Read:
    """One read the reader made: GetStreamInfo's last_seq (None: it failed with `error`)."""

    node: str
    sent_at: float
    done_at: float
    last_seq: int | None
    error: str = ""


@dataclass(frozen=True)
class FaultEvent:
    at: float
    name: str
    phase: str  # start | stop
    targets: tuple[str, ...]
    majority_connected: bool


_Pending = tuple[float, int, str, OpType, str, str, dict[str, object]]


class _Ops:
    """Ops gathered out of order, then sorted by time into a history."""

    def __init__(self, *, started_at: float, node_of: Mapping[str, str]) -> None:
        self._started_at = started_at
        self._node_of = node_of
        self._pending: list[_Pending] = []
        self._order = itertools.count()

    def add(self, at: float, process: str, kind: OpType, f: str, node: str,
            value: Mapping[str, object]) -> None:
        self._pending.append((max(at - self._started_at, 0.0), next(self._order), process,
                              kind, f, self._node_of.get(node, node), dict(value)))

    def call(self, process: str, f: str, node: str, sent_at: float, done_at: float,
             invoke: Mapping[str, object], done: Mapping[str, object], *, ok: bool) -> None:
        self.add(sent_at, process, OpType.INVOKE, f, node, invoke)
        self.add(max(done_at, sent_at), process, OpType.OK if ok else OpType.INFO, f, node,
                 done)

    def history(self) -> list[Op]:
        ordered = sorted(self._pending, key=lambda item: (item[0], item[1]))
        return [Op(index, t, process, kind, f, node, value)  # type: ignore[arg-type]
                for index, (t, _, process, kind, f, node, value) in enumerate(ordered)]


def _calls(attempts: Iterable[Attempt]) -> list[list[Attempt]]:
    """A publisher's attempts, one list per call (the messages sent together)."""
    calls: dict[tuple[float, str], list[Attempt]] = {}
    for attempt in attempts:
        calls.setdefault((attempt.sent_at, attempt.node), []).append(attempt)
    return [calls[key] for key in sorted(calls)]


def _publishes(ops: _Ops, history: PublishHistory) -> None:
    probe = history.name == PROBE_NAME
    for call in _calls(history.attempts):
        first = call[0]
        msg_ids = [a.msg_id for a in call]
        error = next((a.error for a in call if a.error), "")
        ok = not error
        epoch = first.epoch if ok and first.epoch else None
        if probe:
            ops.call(history.name, "probe", first.node, first.sent_at, first.done_at,
                     probe_value(stream=history.stream, msg_id=first.msg_id),
                     probe_value(stream=history.stream, msg_id=first.msg_id,
                                 seq=first.seq if ok else None, epoch=epoch,
                                 primary=first.primary if ok else "", error=error), ok=ok)
            continue
        f = "publish" if len(call) == 1 else "publish_batch"
        seqs: list[int | None] = [a.seq or None for a in call]
        ops.call(history.name, f, first.node, first.sent_at, first.done_at,
                 publish_value(stream=history.stream, msg_ids=msg_ids),
                 publish_value(stream=history.stream, msg_ids=msg_ids,
                               seqs=seqs if ok else (), epoch=epoch,
                               primary=first.primary if ok else "", error=error), ok=ok)


def _consumes(ops: _Ops, history: ConsumeHistory) -> None:
    fetches: dict[tuple[float, float, str], list[Seen]] = {}
    for delivery in history.deliveries:
        key = (delivery.fetch_sent_at, delivery.received_at, delivery.node)
        fetches.setdefault(key, []).append(Seen(delivery.seq, delivery.msg_id, ""))
    for (sent_at, received_at, node), seen in sorted(fetches.items()):
        ops.call(history.name, "fetch", node, sent_at, received_at,
                 fetch_value(stream=history.stream, consumer=history.name),
                 fetch_value(stream=history.stream, consumer=history.name, deliveries=seen),
                 ok=True)
    # Acks run beside the fetches, several at once when the consumer pipelines them: each in
    # the first process of its own (name-ack, name-ack1, ...) with no call open at its start.
    lanes: list[float] = []  # per process, when its last ack ended
    for ack in sorted(history.acks, key=lambda a: (a.sent_at, a.acked_at)):
        lane = next((i for i, free_at in enumerate(lanes) if free_at <= ack.sent_at),
                    len(lanes))
        if lane == len(lanes):
            lanes.append(ack.acked_at)
        lanes[lane] = ack.acked_at
        process = f"{history.name}-ack{lane or ''}"
        ops.call(process, "ack", ack.node, ack.sent_at, ack.acked_at,
                 ack_value(stream=history.stream, consumer=history.name, seqs=ack.seqs),
                 ack_value(stream=history.stream, consumer=history.name, seqs=ack.seqs),
                 ok=True)


def to_history(*, started_at: float, stream: str, node_of: Mapping[str, str],
               published: Sequence[PublishHistory], consumed: Sequence[ConsumeHistory],
               reads: Sequence[Read], faults: Sequence[FaultEvent]) -> list[Op]:
    """One history of the run; times are seconds since `started_at` (the drivers' clock);
    `node_of` names the node behind each address the clients called."""
    ops = _Ops(started_at=started_at, node_of=node_of)
    for history in published:
        _publishes(ops, history)
    for consume in consumed:
        _consumes(ops, consume)
    for read in reads:
        ops.call("reader", "read", read.node, read.sent_at, read.done_at,
                 read_value(stream=stream),
                 read_value(stream=stream, last_seq=read.last_seq, error=read.error),
                 ok=read.last_seq is not None)
    for fault in faults:
        ops.add(fault.at, "nemesis", OpType.INFO, fault.name, "",
                {"phase": fault.phase, "targets": list(fault.targets)})
        if fault.phase == "start" and not fault.majority_connected:
            ops.add(fault.at, "cluster", OpType.INFO, "connected", "", {"majority": False})
        elif fault.phase == "stop" and not fault.majority_connected:
            ops.add(fault.at, "cluster", OpType.INFO, "connected", "", {"majority": True})
    return ops.history()


def final_state(contents: StreamContents, survey: ReplicaSurvey | None) -> Final:
    """The checkers' view of the stream after heal: its contents as the API serves them and,
    when surveyed, every replica's stored bytes."""
    messages = {seq: (view.payload_id or view.msg_id, "")
                for seq, view in contents.messages.items()}
    final_contents = FinalContents(stream=contents.stream, first_seq=contents.first_seq,
                                   last_seq=contents.visible_last_seq, messages=messages)
    replicas: dict[str, ReplicaCopies] = {}
    if survey is not None and survey.copies:
        commit = survey.primary_commit_seq or min(c.commit_seq for c in survey.copies)
        replicas[contents.stream] = ReplicaCopies(
            stream=contents.stream, first_seq=max(c.first_seq for c in survey.copies),
            commit_seq=commit, copies={c.node: c.stored for c in survey.copies})
    return Final(contents={contents.stream: final_contents}, replicas=replicas)
