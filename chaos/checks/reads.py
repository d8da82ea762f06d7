"""Stale reads: `stale_reads` reports a read whose last_seq is below the seq of a write
acknowledged more than `lease_s` before the read was invoked, and a probe (a write) acknowledged
at a seq below one acknowledged before the probe was first sent.

Subtle cases, decided:
- The lease slack applies to reads only. A primary cut off from its replicas may serve reads
  until its lease runs out (and a new primary is only chosen after that), so a read that
  started within `lease_s` of the acknowledgement may legally miss it; one that started later
  must see it. Probes are writes: a write acknowledged below a completed one went to a stale
  log, whatever the lease.
- A probe starts at the first call that carried its msg_id: a retry acknowledged with the
  original seq (dedupe) was stored by an attempt that may precede the other write.
- A read without `last_seq` is not judged here (its messages still count for two payloads).
- Equal seqs (two writes acknowledged at one seq) are split brain, not staleness.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.calls import acked_writes, calls
from raftlog.chaos.checks.realtime import Span, behind
from raftlog.chaos.events import PROBE, READ, Op, get_int, get_str


def stale_reads(history: Sequence[Op], *, lease_s: float) -> list[Anomaly]:
    """STALE_READ per read (or probe) behind an acknowledged write; ops: the write's call,
    then the reader's. Reads are timed in seconds (with the lease slack), probes by history
    position (real-time order, no slack)."""
    all_calls = calls(history)
    writes = acked_writes(history)
    reads = []
    for call in all_calls:
        last_seq = get_int(call.value, "last_seq") if call.f == READ and call.ok else None
        if last_seq is not None:
            node = get_str(call.value, "served_by") or call.invoke.node
            reads.append(Span((call.stream,), call.start_t, call.end_t, last_seq, call.ops,
                              f"read by {call.process} from {node}"))
    by_time = [Span((w.stream,), w.call.start_t, w.call.end_t, w.seq, w.ops, w.msg_id)
               for w in writes]
    by_pos = [Span((w.stream,), w.call.invoke_pos, w.call.end_pos, w.seq, w.ops, w.msg_id)
              for w in writes]
    probes = [Span((w.stream,), w.first_invoke_pos, w.call.end_pos, w.seq, w.ops,
                   f"probe {w.msg_id} by {w.call.process} via {w.node}")
              for w in writes if w.call.f == PROBE]
    found = behind(by_time, reads, slack=lease_s) + behind(by_pos, probes)
    return [_anomaly(write, reader) for write, reader in found]


def _anomaly(write: Span, reader: Span) -> Anomaly:
    acked, started = write.ops[-1], reader.ops[0]
    return Anomaly(
        Kind.STALE_READ,
        f"{reader.label} (#{started.index}, t={started.t:.3f}) returned seq {reader.value} of "
        f"{write.key[0]}, though {write.label} was acknowledged at seq {write.value} "
        f"(#{acked.index}, t={acked.t:.3f}, {started.t - acked.t:.3f} s earlier)",
        (*write.ops, *reader.ops), write.key[0], (write.value, reader.value))
