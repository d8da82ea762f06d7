"""Interest retention of the consumer manager: `RetentionManager` removes the messages of an
interest stream that no consumer still wants.

A message is removed once every consumer whose filter matches it has acknowledged it (a
consumer whose filter does not match it never holds it back), and at once when no consumer's
filter matches it or the stream has no consumer. Checked: up to the lowest ack floor as a range,
each seq a consumer finishes when it does, and new messages once. (Work-queue removal is part of
a consumer's save: serving.py.)
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.base import limits
from raftlog.base import subjects as subject_rules
from raftlog.node.consumers.serving import ManagerBase, ServedStream
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.engine.log import LogEntry
from raftlog.v1 import types_pb2


class RetentionManager(ManagerBase):
    """`ManagerBase` plus the interest-retention trims."""

    async def _maybe_trim(self, found: ServedStream, done: Sequence[int] = ()) -> int:
        """Interest retention: removes what no consumer still wants: everything when the
        stream has no consumer; else what every consumer acknowledged (up to the lowest ack
        floor), each of `done` (seqs a consumer just finished) that every consumer whose filter
        matches it has finished, and new messages that no consumer's filter matches. A trim
        already running takes over `done`."""
        if found.retention != types_pb2.RETENTION_POLICY_INTEREST:
            return 0
        found.trim_due.update(done)
        if found.trimming:
            return 0
        found.trimming = True
        try:
            if not found.consumers:
                found.trim_due.clear()
                log = found.log
                seqs = [entry.seq for entry in log.scan(
                    from_seq=log.first_seq, limit=limits.retention_sweep_deletes_max)]
                return await log.remove(seqs) if seqs else 0
            removed = await self._trim_acked(found)
            while found.trim_due and self._streams.get(found.log.name) is found:
                finished, found.trim_due = found.trim_due, set()
                removed += await self._trim_done(found, finished)
            return removed + await self._trim_unwanted(found)
        finally:
            found.trimming = False

    async def _trim_acked(self, found: ServedStream) -> int:
        removed = 0
        while self._streams.get(found.log.name) is found and found.consumers:
            log = found.log
            floor = self._lowest_floor(found)
            first = log.first_seq
            if first > floor:
                break
            last = min(floor, first + limits.retention_sweep_deletes_max - 1)
            removed += await log.remove(list(range(first, last + 1)))
            if log.first_seq <= last:
                break  # the head did not move past the batch: never spin on it
        return removed

    @staticmethod
    def _lowest_floor(found: ServedStream) -> int:
        return min(min(c.state.ack_floor for c in found.consumers.values()),
                   found.log.commit_seq)

    async def _trim_done(self, found: ServedStream, seqs: set[int]) -> int:
        """Removes each of `seqs` that every consumer whose filter matches its message has
        finished (above the lowest floor: `_trim_acked` had the rest)."""
        log, floor = found.log, self._lowest_floor(found)
        states = [c.state for c in found.consumers.values()]
        removable: list[int] = []
        for seq in sorted(seqs):
            entry = log.peek(seq) if floor < seq <= log.commit_seq else None
            if entry is not None and not any(_holds(state, entry) for state in states):
                removable.append(seq)
        removed = 0
        step = limits.retention_sweep_deletes_max
        for index in range(0, len(removable), step):
            removed += await log.remove(removable[index:index + step])
        return removed

    async def _trim_unwanted(self, found: ServedStream) -> int:
        """Removes committed messages that match no consumer's filter (each seq is looked at
        once: `interest_scanned` moves past it)."""
        log = found.log
        filters = [c.state.config.filter_subject for c in found.consumers.values()]
        if not all(filters):  # some consumer wants every subject
            found.interest_scanned = log.commit_seq
            return 0
        start = max(found.interest_scanned + 1, log.first_seq)
        unwanted: list[int] = []
        scanned = start - 1
        for entry in log.scan(from_seq=start, limit=limits.retention_sweep_deletes_max):
            scanned = entry.seq
            if not any(subject_rules.matches(f, entry.subject) for f in filters):
                unwanted.append(entry.seq)
        if scanned < start:  # nothing stored past the cursor
            scanned = log.commit_seq
        found.interest_scanned = max(found.interest_scanned, scanned)
        return await log.remove(unwanted) if unwanted else 0


def _holds(state: DeliveryState, entry: LogEntry) -> bool:
    """Interest retention: this consumer still wants the message (its filter matches it and
    it is not done with it)."""
    filter_subject = state.config.filter_subject
    return (not filter_subject or subject_rules.matches(filter_subject, entry.subject)) and \
        not state.is_done(entry.seq)
