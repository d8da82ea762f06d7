"""One primary per stream and epoch: `split_brain` reports two nodes that acknowledged writes
(publish or probe ok, with the epoch the answer carried), or that cluster events named primary,
for one stream in one epoch; and two different messages acknowledged at one seq of a stream
(whoever acknowledged them).

Subtle cases, decided:
- The acknowledging node is the ok value's `primary`, else the node the client called: a
  writer whose calls may be forwarded must record `primary`, or forwarding looks like two
  primaries.
- Acknowledgements without an epoch take part in the one-seq rule only.
- The same msg_id acknowledged at one seq several times (retries, dedupe) is one message.

`failovers` (not a checker) lists when each stream's acknowledgements first came from a new
epoch: the failovers, restarts and moves the run went through, for the report and the chart.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import AckedWrite, acked_writes, events
from raftlog.chaos.events import CLUSTER, PRIMARY, HistoryFormatError, Op, get_int, get_str


def split_brain(history: Sequence[Op]) -> list[Anomaly]:
    """SPLIT_BRAIN per (stream, epoch) with two acknowledging (or named) primaries, and per
    (stream, seq) with two messages acknowledged; ops: the first evidence of each."""
    writes = acked_writes(history)
    return _two_primaries(history, writes) + _one_seq_twice(writes)


def _two_primaries(history: Sequence[Op], writes: Sequence[AckedWrite]) -> list[Anomaly]:
    claims: dict[tuple[str, int], dict[str, tuple[Op, ...]]] = collections.defaultdict(dict)
    for write in writes:
        if write.epoch is not None:
            claims[(write.stream, write.epoch)].setdefault(write.node, write.ops)
    for _pos, op in events(history, process=CLUSTER, f=PRIMARY):
        epoch = get_int(op.value, "epoch")
        if epoch is None:
            raise HistoryFormatError(f"{op}: a primary event without an epoch")
        claims[(get_str(op.value, "stream"), epoch)].setdefault(get_str(op.value, "node"), (op,))
    found = []
    for (stream, epoch), by_node in sorted(claims.items()):
        if len(by_node) > 1:
            nodes = tuple(by_node)
            found.append(Anomaly(Kind.SPLIT_BRAIN, f"{' and '.join(nodes)} both primary of "
                                 f"{stream} in epoch {epoch}",
                                 tuple(op for ops in by_node.values() for op in ops),
                                 stream, (), nodes))
    return found


def _one_seq_twice(writes: Sequence[AckedWrite]) -> list[Anomaly]:
    by_seq: dict[tuple[str, int], dict[str, AckedWrite]] = collections.defaultdict(dict)
    for write in writes:
        by_seq[(write.stream, write.seq)].setdefault(write.msg_id, write)
    found = []
    for (stream, seq), by_id in sorted(by_seq.items()):
        if len(by_id) > 1:
            told = " and ".join(f"{msg_id} (by {write.node})" for msg_id, write in by_id.items())
            found.append(Anomaly(Kind.SPLIT_BRAIN, f"seq {seq} of {stream} acknowledged as "
                                 f"{told}", tuple(op for w in by_id.values() for op in w.ops),
                                 stream, (seq,), tuple(dict.fromkeys(w.node for w in
                                                                     by_id.values()))))
    return found


@dataclass(frozen=True)
class Failover:
    """The first acknowledgement of `stream` in a new `epoch`, at `t`, by `node`."""

    stream: str
    epoch: int
    node: str
    t: float


def failovers(history: Sequence[Op]) -> list[Failover]:
    """Each stream's epoch changes among its acknowledgements, in time order (the first epoch
    a stream acknowledged in is not one)."""
    first: dict[tuple[str, int], Failover] = {}
    for write in acked_writes(history):
        if write.epoch is not None and write.call.completion is not None:
            key = (write.stream, write.epoch)
            seen = first.get(key)
            t = write.call.completion.t
            if seen is None or t < seen.t:
                first[key] = Failover(write.stream, write.epoch, write.node, t)
    changes = []
    for stream in sorted({stream for stream, _ in first}):
        epochs = sorted((change for (name, _), change in first.items() if name == stream),
                        key=lambda change: change.epoch)
        changes += epochs[1:]
    return sorted(changes, key=lambda change: change.t)
