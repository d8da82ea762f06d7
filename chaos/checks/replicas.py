"""Replicas after heal and convergence: `replicas_differ` reports a replica that lacks part of
the committed prefix [first_seq, commit_seq] (REPLICA_MISSING, one per node and run of seqs)
and a seq whose stored bytes differ between replicas (REPLICA_DIFFERS, naming the nodes that
differ from the bytes most replicas hold).

Subtle cases, decided:
- Within the committed prefix every replica holding a seq must hold the same bytes, even when
  another replica lacks it. Above commit_seq only seqs every replica holds are compared: an
  uncommitted tail on some copies is not judged.
- With a tie (two copies, two values) the reference is the first node in name order.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable, Iterator, Mapping

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.final import Final, ReplicaCopies

shown_digest_bytes = 4  # bytes of a stored value's digest shown in a description


def replicas_differ(final: Final) -> list[Anomaly]:
    found = []
    for stream, replicas in sorted(final.replicas.items()):
        found += _missing(stream, replicas)
        found += _differing(stream, replicas)
    return found


def _missing(stream: str, replicas: ReplicaCopies) -> list[Anomaly]:
    found = []
    for node, stored in sorted(replicas.copies.items()):
        for low, high in runs(seq for seq in range(replicas.first_seq, replicas.commit_seq + 1)
                               if seq not in stored):
            span = f"seq {low}" if low == high else f"seqs {low}..{high}"
            found.append(Anomaly(Kind.REPLICA_MISSING, f"{node} lacks {span} of {stream} "
                                 f"(committed prefix {replicas.first_seq}..{replicas.commit_seq})",
                                 (), stream, (low, high), (node,)))
    return found


def _differing(stream: str, replicas: ReplicaCopies) -> list[Anomaly]:
    copies = dict(sorted(replicas.copies.items()))
    held: set[int] = set().union(*(set(stored) for stored in copies.values()))
    found = []
    for seq in sorted(held):
        holders = {node: stored[seq] for node, stored in copies.items() if seq in stored}
        if seq > replicas.commit_seq and len(holders) < len(copies):
            continue
        differing = _differ_from_most(holders)
        if differing:
            told = ", ".join(f"{node}={_short(value)}" for node, value in holders.items())
            found.append(Anomaly(Kind.REPLICA_DIFFERS, f"seq {seq} of {stream} differs: "
                                 f"{told}", (), stream, (seq,), differing))
    return found


def _differ_from_most(holders: Mapping[str, bytes]) -> tuple[str, ...]:
    """The nodes whose bytes are not the most common (first node's on a tie)."""
    counts = collections.Counter(holders.values())
    reference = max(holders.values(), key=lambda value: counts[value])  # first on a tie
    return tuple(node for node, value in holders.items() if value != reference)


def _short(value: bytes) -> str:
    digest = hashlib.blake2b(value, digest_size=shown_digest_bytes).hexdigest()
    return f"{len(value)}B:{digest}"


def runs(seqs: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Inclusive runs of consecutive seqs, from ascending seqs."""
    start = previous = None
    for seq in seqs:
        if previous is not None and seq == previous + 1:
            previous = seq
            continue
        if start is not None and previous is not None:
            yield (start, previous)
        start = previous = seq
    if start is not None and previous is not None:
        yield (start, previous)
