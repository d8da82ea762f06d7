"""Bugs the simulation can inject on purpose, to show that it finds them (tests/unit/test_sim.py)
and to measure how many schedules that takes. Each is off unless a run names it (`--bug`).

- `commit-without-majority`: the primary's commit rule counts only its own fsync (a patched
  `StreamReplicator._recompute_commit`): a publish is acknowledged before any replica holds it,
  so an isolated or crashed primary loses acknowledged messages at the next failover.
- `replica-acks-before-fsync`: a replica's ReplicationService is given a committer whose
  `durable()` returns at once (chaos/sim/store.py `LyingCommitter`): it acknowledges batches
  that a crash of that replica then loses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from raftlog.node.replication.primary import StreamReplicator

COMMIT_WITHOUT_MAJORITY = "commit-without-majority"
REPLICA_ACKS_BEFORE_FSYNC = "replica-acks-before-fsync"
BUGS = (COMMIT_WITHOUT_MAJORITY, REPLICA_ACKS_BEFORE_FSYNC)


def _commit_on_local_fsync(self: StreamReplicator) -> None:
    """The broken rule: the local fsync alone commits."""
    before = self.stream.commit_seq
    self.stream.set_commit_seq(self.stream.durable_seq)
    if self.stream.commit_seq != before:
        self._tell_commit()


@contextlib.contextmanager
def injected(bug: str) -> Iterator[None]:
    """The bug in place for the duration (class patches are undone on exit)."""
    if bug and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {', '.join(BUGS)}")
    if bug != COMMIT_WITHOUT_MAJORITY:
        yield
        return
    original = StreamReplicator._recompute_commit
    StreamReplicator._recompute_commit = _commit_on_local_fsync  # type: ignore[method-assign]
    try:
        yield
    finally:
        StreamReplicator._recompute_commit = original  # type: ignore[method-assign]
