"""The verdict of one run, pure: the clients' `History` and the copies every node holds after
the heal in, `Violation`s out.

Safety (the contract, docs DESIGN §1):
- acked-lost / acked-moved: an acknowledged msg_id is not in the committed log at its seq (G1);
- ack-seq-changed: one msg_id acknowledged at two seqs (G6);
- duplicate: one msg_id stored at two committed seqs (G6);
- gap: a seq missing between the head and the commit seq (G2);
- diverged: two copies differ on a seq both hold at or below the commit seq (G7);
- epoch-order: epochs go down along the log;
- two-primaries: two nodes served the same stream at the same fence epoch (G3);
- read-not-committed: a read returned what the final committed log does not hold there (G4);
- delivered-not-committed: a consumer was handed what the final committed log does not hold
  there (G4);
- ack-undone: a seq delivered by a fetch sent after an ack of it was acknowledged (G5);
- undelivered: a committed seq a drained consumer never received (at-least-once).
Liveness, after the heal and the settle time:
- not-converged: the named primary does not serve, or a replica's last or commit seq differs
  from the primary's;
- commit-lag: a replica holds every seq but its commit seq lags the primary's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raftlog.chaos.sim.workload import History
from raftlog.internal import storage_pb2

shown_per_kind_max = 3  # violations of one kind kept in a verdict
COMMIT_LAG = "commit-lag"
UNDELIVERED = "undelivered"

# Kinds that stem from product bugs already reported, with the reason; a run counts them as
# known, not as failures, unless it is strict. Remove an entry once its bug is fixed.
KNOWN_ISSUES: dict[str, str] = {}


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Copy:
    """One node's copy of a stream after the run."""

    node: str
    role: str
    serving: bool  # primary, not deposed
    epoch: int
    first_seq: int
    last_seq: int
    commit_seq: int
    stored: Mapping[int, bytes]


@dataclass(frozen=True)
class Assignment:
    """A stream's committed placement after the run."""

    primary: str
    replicas: tuple[str, ...]
    fence_epoch: int


def check(*, history: History, copies: Mapping[str, Mapping[str, Copy]],
          assignments: Mapping[str, Assignment]) -> list[Violation]:
    """Every violation found (see the module docstring), a few per kind."""
    found: list[Violation] = []
    for stream in sorted(assignments):
        found += _check_stream(stream, history, copies.get(stream, {}), assignments[stream])
    found += _check_primacy(history)
    kept: dict[str, int] = {}
    shown = []
    for violation in found:
        kept[violation.kind] = kept.get(violation.kind, 0) + 1
        if kept[violation.kind] <= shown_per_kind_max:
            shown.append(violation)
    return shown


def _check_stream(stream: str, history: History, copies: Mapping[str, Copy],
                  assignment: Assignment) -> list[Violation]:
    primary = copies.get(assignment.primary)
    if primary is None:
        return [Violation("not-converged", f"{stream}: primary {assignment.primary} holds no "
                          "copy")]
    found: list[Violation] = []
    if not primary.serving:
        found.append(Violation("not-converged", f"{stream}: primary {primary.node} does not "
                               "serve"))
    commit = primary.commit_seq
    log = {seq: _decode(value) for seq, value in primary.stored.items() if seq <= commit}
    found += [Violation("gap", f"{stream}: seq {seq} missing on {primary.node}")
              for seq in range(primary.first_seq, commit + 1) if seq not in log]
    found += _check_replicas(stream, copies, assignment, primary)
    found += _check_log(stream, log)
    found += _check_acks(stream, history, log)
    found += _check_consumer(stream, history, log, drained=stream in history.drained)
    for read_stream, served in history.reads:
        held = log.get(served.seq)
        if read_stream == stream and served.seq <= commit and (
                held is None or (held.msg_id, held.payload) != (served.msg_id, served.payload)):
            found.append(Violation("read-not-committed", f"{stream}: seq {served.seq} read "
                                   f"{served.msg_id!r} from {served.node} at epoch "
                                   f"{served.epoch}; the log holds "
                                   f"{held.msg_id if held else None!r}"))
    return found


def _check_replicas(stream: str, copies: Mapping[str, Copy], assignment: Assignment,
                    primary: Copy) -> list[Violation]:
    found = []
    for node in assignment.replicas:
        copy = copies.get(node)
        if copy is None:
            found.append(Violation("not-converged", f"{stream}: replica {node} holds no copy"))
            continue
        if copy.last_seq == primary.last_seq and copy.commit_seq < primary.commit_seq:
            found.append(Violation(COMMIT_LAG, f"{stream}: {node} holds every seq to "
                                   f"{copy.last_seq} but its commit seq stays at "
                                   f"{copy.commit_seq} (primary {primary.node}: "
                                   f"{primary.commit_seq})"))
        elif (copy.last_seq, copy.commit_seq) != (primary.last_seq, primary.commit_seq):
            found.append(Violation("not-converged", f"{stream}: {node} at last/commit "
                                   f"{copy.last_seq}/{copy.commit_seq}, primary "
                                   f"{primary.node} at {primary.last_seq}/{primary.commit_seq}"))
        low = max(copy.first_seq, primary.first_seq)
        for seq in range(low, min(copy.last_seq, primary.commit_seq) + 1):
            if copy.stored.get(seq) != primary.stored.get(seq):
                found.append(Violation("diverged", f"{stream}: seq {seq} differs between "
                                       f"{primary.node} and {node}"))
                break
    return found


def _check_log(stream: str, log: Mapping[int, storage_pb2.StoredMessage]) -> list[Violation]:
    found = []
    seen: dict[str, int] = {}
    epoch = 0
    for seq in sorted(log):
        message = log[seq]
        if message.msg_id in seen:
            found.append(Violation("duplicate", f"{stream}: {message.msg_id} at seqs "
                                   f"{seen[message.msg_id]} and {seq}"))
        seen[message.msg_id] = seq
        if message.epoch < epoch:
            found.append(Violation("epoch-order", f"{stream}: seq {seq} has epoch "
                                   f"{message.epoch} after epoch {epoch}"))
        epoch = max(epoch, message.epoch)
    return found


def _check_acks(stream: str, history: History,
                log: Mapping[int, storage_pb2.StoredMessage]) -> list[Violation]:
    found = []
    for msg_id in sorted(history.acks):
        if history.sent[msg_id][0] != stream:
            continue
        seqs = sorted({served.seq for served in history.acks[msg_id]})
        if len(seqs) > 1:
            found.append(Violation("ack-seq-changed", f"{stream}: {msg_id} acknowledged at "
                                   f"seqs {seqs}"))
        held = log.get(seqs[0])
        if held is None:
            found.append(Violation("acked-lost", f"{stream}: {msg_id} acknowledged at seq "
                                   f"{seqs[0]} by {history.acks[msg_id][0].node}; nothing "
                                   "committed there"))
        elif (held.msg_id, held.payload) != (msg_id, history.sent[msg_id][1]):
            found.append(Violation("acked-moved", f"{stream}: {msg_id} acknowledged at seq "
                                   f"{seqs[0]}, which holds {held.msg_id!r}"))
    return found


def _check_consumer(stream: str, history: History,
                    log: Mapping[int, storage_pb2.StoredMessage], *,
                    drained: bool) -> list[Violation]:
    found = []
    acked_s: dict[int, float] = {}
    for ack in history.consumer_acks:
        if ack.stream == stream:
            for seq in ack.seqs:
                acked_s[seq] = min(acked_s.get(seq, ack.acked_s), ack.acked_s)
    delivered: set[int] = set()
    for delivery in history.deliveries:
        if delivery.stream != stream:
            continue
        served = delivery.served
        delivered.add(served.seq)
        held = log.get(served.seq)
        if held is None or (held.msg_id, held.payload) != (served.msg_id, served.payload):
            found.append(Violation("delivered-not-committed", f"{stream}: seq {served.seq} "
                                   f"delivered {served.msg_id!r} by {served.node} at epoch "
                                   f"{served.epoch}; the log holds "
                                   f"{held.msg_id if held else None!r}"))
        acked = acked_s.get(served.seq)
        if acked is not None and delivery.fetch_sent_s > acked:
            found.append(Violation("ack-undone", f"{stream}: seq {served.seq} acknowledged at "
                                   f"{acked:.3f} s, delivered again by {served.node} to a "
                                   f"fetch sent at {delivery.fetch_sent_s:.3f} s"))
    if drained:
        found += [Violation(UNDELIVERED, f"{stream}: seq {seq} never delivered")
                  for seq in sorted(log) if seq not in delivered]
    return found


def _check_primacy(history: History) -> list[Violation]:
    """G3 from the clients' side: the node that answered, per (stream, epoch)."""
    servers: dict[tuple[str, int], set[str]] = {}
    for msg_id, acks in history.acks.items():
        for served in acks:
            if not served.duplicate:
                servers.setdefault((history.sent[msg_id][0], served.epoch), set()).add(
                    served.node)
    return [Violation("two-primaries", f"{stream}: epoch {epoch} served by {sorted(nodes)}")
            for (stream, epoch), nodes in sorted(servers.items()) if len(nodes) > 1]



def _decode(value: bytes) -> storage_pb2.StoredMessage:
    return storage_pb2.StoredMessage.FromString(value)
