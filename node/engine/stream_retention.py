"""Retention of one stream: the limits (messages, bytes, messages per subject) applied as
messages are published or the config changes, age expiry for the engine's sweep, removal of
given seqs (work queue, interest) and purges.

Removals are written at once and made durable by the group commit of the caller (publishing)
or awaited here.
"""

from __future__ import annotations

from raftlog.base import limits, subjects
from raftlog.base.errors import InvariantViolation
from raftlog.internal import storage_pb2
from raftlog.node.engine.stream_core import StreamCore


class StreamRetention(StreamCore):
    """Retention: limits, expiry, removal and purges of `Stream` (stream.py)."""

    def _has_limits(self) -> bool:
        config = self.config
        return bool(config.max_msgs or config.max_bytes or config.max_msgs_per_subject)

    def _over_limits(self, subject: str) -> bool:
        config = self.config
        stat = self.subject_stats.get(subject)
        return bool(
            (config.max_msgs and self.record.messages > config.max_msgs)
            or (config.max_bytes and self.record.bytes > config.max_bytes)
            or (config.max_msgs_per_subject and stat and stat.count > config.max_msgs_per_subject)
        )

    def _enforce_limits(self, subject: str) -> int:
        """Removes the oldest messages until the stream is within its limits; written, not
        yet durable (the caller's commit covers it)."""
        config = self.config
        removed = 0
        touched: set[str] = set()
        batch = self._store.batch()
        stat = self.subject_stats.get(subject)
        if config.max_msgs_per_subject and stat and stat.count > config.max_msgs_per_subject:
            excess = stat.count - config.max_msgs_per_subject
            oldest = list(self._subject_seqs(subject, from_seq=1, to_seq=self.last_seq))[:excess]
            for seq in oldest:
                removed += self._delete_seq(batch, seq, touched)
            batch = self._write(batch, touched)
            self._advance_head()
        while (config.max_msgs and self.record.messages > config.max_msgs) or (
            config.max_bytes and self.record.bytes > config.max_bytes
        ):
            head = self.record.first_seq
            if not self._delete_seq(batch, head, touched):
                raise InvariantViolation(f"stream {self.name}: head seq {head} is missing")
            removed += 1
            batch = self._write(batch, touched)
            touched = set()
            self._advance_head()
        self._write(batch, touched)
        self._advance_head()
        return removed

    async def enforce_limits(self) -> int:
        """After a config change: prunes to the (new) limits, durably."""
        removed = 0
        for subject in list(self.subject_stats):
            removed += self._enforce_limits(subject)
        removed += self._enforce_limits("")
        if removed:
            await self._store.durable()
        return removed

    async def remove(self, seqs: list[int]) -> int:
        batch = self._store.batch()
        touched: set[str] = set()
        removed = sum(self._delete_seq(batch, seq, touched) for seq in sorted(set(seqs))
                      if 0 < seq <= self._commit_seq)
        self._write(batch, touched)
        self._advance_head()
        if removed:
            await self._store.durable()
        return removed

    async def expire(self, *, now_ms: int) -> int:
        """Removes messages older than max_age (at most retention_sweep_deletes_max)."""
        if not self.config.max_age_ms or not self.record.messages:
            return 0
        cutoff = now_ms - self.config.max_age_ms
        expired: list[int] = []
        for seq, raw in self._committed_items(self.first_seq):
            if len(expired) >= limits.retention_sweep_deletes_max or \
                    storage_pb2.StoredMessage.FromString(raw).ts_ms >= cutoff:
                break
            expired.append(seq)
        return await self.remove(expired) if expired else 0

    async def purge(self, *, subject: str, below_seq: int, keep: int) -> int:
        if not subject and not below_seq and not keep:
            return await self._purge_all()
        candidates = self._purge_candidates(subject, below_seq=below_seq)
        if keep:
            candidates = candidates[: max(len(candidates) - keep, 0)]
        return await self.remove(candidates)

    def _purge_candidates(self, subject: str, *, below_seq: int) -> list[int]:
        upper = min(below_seq - 1, self.last_seq) if below_seq else self.last_seq
        if not subject:
            return list(self._store.message_seqs(self.stream_id, lower=self.first_seq,
                                                 upper=upper + 1))
        found: list[int] = []
        for name in list(self.subject_stats):
            if subjects.matches(subject, name):
                found.extend(self._subject_seqs(name, from_seq=1, to_seq=upper))
        return sorted(found)

    async def _purge_all(self) -> int:
        purged = self.record.messages
        batch = self._store.batch()
        batch.drop_messages(self.stream_id)
        self.subject_stats.clear()
        self.record.messages = 0
        self.record.bytes = 0
        self.record.first_seq = self.record.last_seq + 1
        self._write(batch, set())
        await self._store.durable()
        return purged
