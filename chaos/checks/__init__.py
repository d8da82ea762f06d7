"""The chaos harness's checkers: pure functions from a history (chaos/events.py) and, for some,
what was read after the run (`Final`) to a list of `Anomaly`s. No I/O, no clock.

- `anomaly.py`      `Anomaly` (kind, description, ops, stream, seqs, nodes) and `Kind`.
- `final.py`        `Final`: each stream's contents and each replica's bytes after heal.
- `calls.py`        the history paired into `Call`s; `AckedWrite`s (acknowledged messages).
- `realtime.py`     the shared rule "what started after X ended sees at least X" (`behind`).
- `seen.py`         every sighting of a message at a seq (fetches, reads, final contents).
- `stored.py`       `lost` (and wrong seq), `duplicates`, `gaps`.
- `payloads.py`     `two_payloads`: one seq seen holding different messages.
- `order.py`        `producer_order`: a producer's acknowledged seqs increase.
- `consumers.py`    `acks_undone`, `ack_floors_backwards`.
- `primaries.py`    `split_brain`: two primaries in one epoch, two messages at one seq.
- `reads.py`        `stale_reads`: reads and probes behind an acknowledged write.
- `replicas.py`     `replicas_differ`: replicas byte-equal on the committed prefix.
- `availability.py` `measure_availability`, `check_availability`: windows and recovery.
- `verdict.py`      `check_all` -> `Verdict` (counts per kind, `summary()`).

Each module's docstring says how it decides its subtle cases.
"""

from __future__ import annotations

from raftlog.chaos.checks.anomaly import Anomaly, Kind
from raftlog.chaos.checks.availability import (
    Availability,
    Recovery,
    Window,
    check_availability,
    measure_availability,
)
from raftlog.chaos.checks.consumers import ack_floors_backwards, acks_undone
from raftlog.chaos.checks.final import Final, FinalContents, ReplicaCopies
from raftlog.chaos.checks.order import producer_order
from raftlog.chaos.checks.payloads import two_payloads
from raftlog.chaos.checks.primaries import split_brain
from raftlog.chaos.checks.reads import stale_reads
from raftlog.chaos.checks.replicas import replicas_differ
from raftlog.chaos.checks.stored import duplicates, gaps, lost
from raftlog.chaos.checks.verdict import Verdict, VerdictFailed, check_all

__all__ = [
    "Anomaly",
    "Availability",
    "Final",
    "FinalContents",
    "Kind",
    "Recovery",
    "ReplicaCopies",
    "Verdict",
    "VerdictFailed",
    "Window",
    "ack_floors_backwards",
    "acks_undone",
    "check_all",
    "check_availability",
    "duplicates",
    "gaps",
    "lost",
    "measure_availability",
    "producer_order",
    "replicas_differ",
    "split_brain",
    "stale_reads",
    "two_payloads",
]
