"""What the final contents must hold, given what was acknowledged: `lost` (an acknowledged
message absent, or stored at another seq than acknowledged), `duplicates` (one msg_id stored at
several seqs) and `gaps` (seqs missing between the first and the last that no retention or
delete removed).

Subtle cases, decided:
- An acknowledged message whose seq is below the stream's first_seq (or in `removed`) and that
  is absent was removed by retention: not lost. If it is present at another seq, that is a
  wrong seq all the same.
- A retried publish acknowledged again with the original seq (the server's dedupe) is one
  message: its acks are checked together and reported once.
- A message never acknowledged may be stored or not (the outcome of a fail is "not stored" for
  the client, but only duplicates and gaps judge storage): not reported here.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import AckedWrite, acked_writes
from raftlog.chaos.checks.final import Final, FinalContents
from raftlog.chaos.events import Op


def lost(history: Sequence[Op], final: Final) -> list[Anomaly]:
    """LOST and WRONG_SEQ, one per acknowledged (stream, msg_id, seq), for the streams `final`
    holds contents of."""
    acks: dict[tuple[str, str, int], list[AckedWrite]] = collections.defaultdict(list)
    for write in acked_writes(history):
        if write.stream in final.contents:
            acks[(write.stream, write.msg_id, write.seq)].append(write)
    stored_at = {stream: _seqs_by_id(contents) for stream, contents in final.contents.items()}
    found = []
    for (stream, msg_id, seq), writes in acks.items():
        contents, seqs = final.contents[stream], stored_at[stream].get(msg_id, [])
        ops = tuple(op for write in writes for op in write.ops)
        if seq in seqs:
            continue
        if seqs:
            found.append(Anomaly(Kind.WRONG_SEQ, f"{msg_id} acknowledged at seq {seq} of "
                                 f"{stream}, stored at {seqs}", ops, stream, (seq, *seqs)))
        elif seq >= contents.first_seq and seq not in contents.removed:
            found.append(Anomaly(Kind.LOST, f"{msg_id} acknowledged at seq {seq} of {stream} "
                                 f"(by {writes[0].node}), absent from the final contents",
                                 ops, stream, (seq,), (writes[0].node,)))
    return found


def duplicates(history: Sequence[Op], final: Final) -> list[Anomaly]:
    """DUPLICATE per msg_id stored at more than one seq (messages without a msg_id aside),
    naming the publishes of that msg_id."""
    writes_by_id: dict[tuple[str, str], list[Op]] = collections.defaultdict(list)
    for write in acked_writes(history):
        writes_by_id[(write.stream, write.msg_id)] += write.ops
    found = []
    for stream, contents in sorted(final.contents.items()):
        for msg_id, seqs in _seqs_by_id(contents).items():
            if msg_id and len(seqs) > 1:
                ops = tuple(dict.fromkeys(writes_by_id.get((stream, msg_id), [])))
                found.append(Anomaly(Kind.DUPLICATE, f"{msg_id} stored at seqs {seqs} of "
                                     f"{stream}", ops, stream, tuple(seqs)))
    return found


def gaps(final: Final) -> list[Anomaly]:
    """GAP per run of seqs in [first_seq, last_seq] neither served nor removed; `seqs` holds
    the run's first and last."""
    found = []
    for stream, contents in sorted(final.contents.items()):
        for low, high in _missing_runs(contents):
            span = f"seq {low}" if low == high else f"seqs {low}..{high}"
            found.append(Anomaly(Kind.GAP, f"{span} of {stream} missing between first_seq "
                                 f"{contents.first_seq} and last_seq {contents.last_seq}",
                                 (), stream, (low, high)))
    return found


def _seqs_by_id(contents: FinalContents) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for seq, (msg_id, _digest) in sorted(contents.messages.items()):
        seqs[msg_id].append(seq)
    return seqs


def _missing_runs(contents: FinalContents) -> Iterator[tuple[int, int]]:
    """Inclusive runs of seqs in [first_seq, last_seq] that are neither served nor removed."""
    held = sorted(seq for seq in set(contents.messages) | contents.removed
                  if contents.first_seq <= seq <= contents.last_seq)
    expected = contents.first_seq
    for seq in [*held, contents.last_seq + 1]:
        if seq > expected:
            yield (expected, seq - 1)
        expected = seq + 1
