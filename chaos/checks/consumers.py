"""Durable consumers: `acks_undone` (a seq delivered again after its ack was acknowledged) and
`ack_floors_backwards` (an observed ack floor lower than one observed before).

Subtle cases, decided:
- A consumer is (stream, consumer name): fetches and acks by different processes of one
  durable consumer are checked together (an ack acknowledged to one client must not come back
  to another).
- An ack counts from its ok completion, for the seqs the completion lists (the ones the server
  accepted; the invoke's when the completion lists none). A redelivery by a fetch invoked
  before that completion (even one completing after it), or after an ack that failed, whose
  outcome is unknown (info) or that never completed, is legal.
- Ack floors are compared per consumer across nodes: an observer must read the authoritative
  state, so a node reporting a lower floor after a higher one was observed counts. Two
  observations that overlapped in time are not ordered. A consumer deleted and recreated
  restarts its floor: record it under another name.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import Call, calls, events
from raftlog.chaos.checks.realtime import Span, behind
from raftlog.chaos.events import (
    ACK,
    ACK_FLOOR,
    CLUSTER,
    FETCH,
    HistoryFormatError,
    Op,
    Value,
    get_int,
    get_ints,
    get_seen,
    get_str,
)

Consumer = tuple[str, str]  # (stream, consumer name)


def acks_undone(history: Sequence[Op]) -> list[Anomaly]:
    """ACK_UNDONE per fetch that delivered seqs whose acks had completed ok before the fetch
    was invoked; its ops are the acks' calls, then the fetch's."""
    all_calls = calls(history)
    first_ack: dict[tuple[Consumer, int], Call] = {}
    for call in sorted((c for c in all_calls if c.f == ACK and c.ok), key=lambda c: c.end_pos):
        for seq in get_ints(call.value, "seqs"):
            if seq is not None:
                first_ack.setdefault((_consumer(call.value), seq), call)
    found = []
    for fetch in all_calls:
        if fetch.f != FETCH or not fetch.ok:
            continue
        consumer = _consumer(fetch.value)
        undone = {item.seq: first_ack[(consumer, item.seq)]
                  for item in get_seen(fetch.value, "deliveries")
                  if (consumer, item.seq) in first_ack
                  and first_ack[(consumer, item.seq)].end_pos < fetch.invoke_pos}
        if undone:
            ack_ops = tuple(dict.fromkeys(op for call in undone.values() for op in call.ops))
            seqs = tuple(sorted(undone))
            found.append(Anomaly(
                Kind.ACK_UNDONE, f"consumer {consumer[1]} of {consumer[0]}: seqs {list(seqs)} "
                f"delivered again (fetch #{fetch.invoke.index} by {fetch.process}) after their "
                "acks were acknowledged", (*ack_ops, *fetch.ops), consumer[0], seqs,
                (fetch.invoke.node,)))
    return found


def ack_floors_backwards(history: Sequence[Op]) -> list[Anomaly]:
    """ACK_FLOOR_BACKWARDS per observed floor below one observed (completed) before it; ops:
    the higher observation, then the lower."""
    spans = [_floor_span(op.value, pos, pos, (op,), op.node)
             for pos, op in events(history, process=CLUSTER, f=ACK_FLOOR)]
    spans += [_floor_span(call.value, call.invoke_pos, call.end_pos, call.ops, call.invoke.node)
              for call in calls(history) if call.f == ACK_FLOOR and call.ok]
    found = []
    for higher, lower in behind(spans, spans):
        stream, consumer = higher.key
        found.append(Anomaly(
            Kind.ACK_FLOOR_BACKWARDS,
            f"ack floor of consumer {consumer} of {stream} went back from {higher.value} "
            f"({higher.label}) to {lower.value} ({lower.label})",
            (*higher.ops, *lower.ops), stream, (higher.value, lower.value),
            tuple(dict.fromkeys((higher.label, lower.label)))))
    return found


def _consumer(value: Value) -> Consumer:
    return (get_str(value, "stream"), get_str(value, "consumer"))


def _floor_span(value: Value, start: float, end: float, ops: tuple[Op, ...],
                reported_by: str) -> Span:
    floor = get_int(value, "ack_floor")
    if floor is None:
        raise HistoryFormatError(f"#{ops[0].index}: an ack_floor observation without ack_floor")
    return Span(_consumer(value), start, end, floor, ops, get_str(value, "node") or reported_by)

