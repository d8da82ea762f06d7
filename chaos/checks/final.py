"""What the cluster holds at the end of a run, after heal and convergence, as the checkers take
it: each stream's contents as the public API serves them (`FinalContents`) and each replica's
stored bytes (`ReplicaCopies`). Plain values; collecting them is the collectors' job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Stored = tuple[str, str]  # (msg_id, payload digest); '' when unknown


@dataclass(frozen=True)
class FinalContents:
    """One stream read after heal: `messages[seq] = (msg_id, digest)` for every seq it serves.

    Seqs below `first_seq` were removed by retention; `removed` names seqs above it that were
    removed on purpose (deletes, per-subject limits). `last_seq` is the stream's last seq (the
    committed one); a seq in [first_seq, last_seq] neither served nor removed is a gap."""

    stream: str
    first_seq: int
    last_seq: int
    messages: Mapping[int, Stored]
    removed: frozenset[int] = frozenset()


@dataclass(frozen=True)
class ReplicaCopies:
    """Each replica's stored bytes of one stream, read after convergence:
    `copies[node][seq] = bytes`. Every copy must hold [first_seq, commit_seq] (the committed
    prefix the primary reports)."""

    stream: str
    first_seq: int
    commit_seq: int
    copies: Mapping[str, Mapping[int, bytes]]


@dataclass(frozen=True)
class Final:
    """Everything read after the run, by stream. A stream without contents is not checked for
    loss, duplicates or gaps; one without copies is not checked for replica equality."""

    contents: Mapping[str, FinalContents] = field(default_factory=dict)
    replicas: Mapping[str, ReplicaCopies] = field(default_factory=dict)
