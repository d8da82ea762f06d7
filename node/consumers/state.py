"""One consumer's delivery state and every rule that changes it. No I/O; time comes in as
`now_s` (the injected Clock's monotonic seconds).

Seq bookkeeping (stream seqs throughout):
- `delivered_seq` is the delivery cursor: every seq at or below it was handed out or skipped
  (not matching the filter, removed, or before the start position).
- `pending` holds the seqs handed out and not yet acked, terminated or dead-lettered.
- `acked` holds seqs above the ack floor that were acked, terminated, dead-lettered, or found
  removed while pending; it only matters until the floor passes them.
- The ack floor is (lowest pending seq - 1), or `delivered_seq` when nothing is pending: every
  seq at or below it is done for this consumer.
- DELIVER_POLICY_LAST_PER_SUBJECT first hands out `start_seqs` (all above the cursor), then
  continues after `start_resume_seq`, the commit seq when the consumer was created.

Settling (Ack, Term, Nak, InProgress) is decided per seq: valid seqs take effect even when other
seqs of the same call are refused. A seq counts as delivered, so may be settled, when
- it is at or below the ack floor, pending, or already in `acked` (settling it again changes
  nothing); or
- it lies above the cursor, at or below `restored_last_seq` and the stream's commit seq, and
  still holds a message the filter matches (or its message is gone). `restored_last_seq` is the
  stream's last seq when this state was restored from a record (after a restart or a failover,
  0 for a consumer created here): an earlier primary, or this node before it restarted, may have
  handed out any such seq without the record saying so (deliveries are not saved, and the
  cluster's record keeps only the floor, the acked set and the cursor). An ack of such a seq
  goes into `acked` ahead of the cursor, and delivery passes over it: it is never handed out
  again (G5).
A seq above the cursor that no earlier primary can have handed out (above `restored_last_seq`),
and a seq the cursor passed without handing it out (filter, removed), are NOT_DELIVERED; one
above the commit seq but at or below `restored_last_seq` is CATCHING_UP (a new primary's commit
seq has not yet reached it: retry).

The durable form is `storage_pb2.ConsumerRecord`; `to_record` / `from_record` convert, and
`from_record` checks that the record's ack floor is the one its contents imply.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from raftlog.base import limits
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.v1 import consumers_pb2


@dataclass(slots=True)
class Delivery:
    deliveries: int
    deadline_s: float  # monotonic; redelivery is due at or after it
    token: int  # changes on every reschedule; heap entries with an older token are stale


class PendingSet:
    """Delivered, unacknowledged seqs with their delivery counts and redelivery deadlines.

    Seqs are added in ascending order (the delivery cursor only moves up), so the dict's
    insertion order is seq order and its first key is the lowest pending seq. Deadlines sit in
    a heap; once a deadline passes its seq moves to the `due` heap, ordered by seq. Both heaps
    are cleaned lazily (token mismatch = stale) and rebuilt when stale entries pile up.
    """

    def __init__(self) -> None:
        self._entries: dict[int, Delivery] = {}
        self._timers: list[tuple[float, int, int]] = []  # (deadline_s, seq, token)
        self._due: list[tuple[int, int]] = []  # (seq, token)
        self._tokens = itertools.count(1)
        self._highest_added = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, seq: int) -> bool:
        return seq in self._entries

    def get(self, seq: int) -> Delivery | None:
        return self._entries.get(seq)

    def items(self) -> Iterator[tuple[int, Delivery]]:
        """Ascending by seq."""
        return iter(self._entries.items())

    def lowest(self) -> int | None:
        return next(iter(self._entries), None)

    def add(self, seq: int, *, deliveries: int, deadline_s: float) -> None:
        if seq <= self._highest_added:
            raise InvariantViolation(f"pending seq {seq} added after {self._highest_added}")
        self._highest_added = seq
        self._entries[seq] = Delivery(deliveries, deadline_s, next(self._tokens))
        self._push_timer(seq, self._entries[seq])

    def add_new(self, seqs: Sequence[int], *, deadline_s: float) -> None:
        """`add` of first deliveries (ascending seqs) sharing one deadline."""
        if seqs[0] <= self._highest_added:
            raise InvariantViolation(f"pending seq {seqs[0]} added after {self._highest_added}")
        self._highest_added = seqs[-1]
        entries, timers, tokens = self._entries, self._timers, self._tokens
        for seq in seqs:
            token = next(tokens)
            entries[seq] = Delivery(1, deadline_s, token)
            heapq.heappush(timers, (deadline_s, seq, token))
        self._rebuild_if_stale()

    def reschedule(self, seq: int, *, deadline_s: float, deliveries: int | None = None) -> None:
        entry = self._entries[seq]
        entry.deadline_s = deadline_s
        entry.token = next(self._tokens)
        if deliveries is not None:
            entry.deliveries = deliveries
        self._push_timer(seq, entry)

    def remove(self, seq: int) -> Delivery | None:
        return self._entries.pop(seq, None)

    def remove_all(self, seqs: Sequence[int]) -> bool:
        """Removes every one of `seqs` (distinct) if each is pending; else removes none and
        returns False."""
        entries = self._entries
        if not all(seq in entries for seq in seqs):
            return False
        for seq in seqs:
            del entries[seq]
        return True

    def first_due(self, now_s: float) -> int | None:
        """The lowest seq whose redelivery is due, left in place (reschedule it to move on)."""
        while self._timers and self._timers[0][0] <= now_s:
            _, seq, token = heapq.heappop(self._timers)
            if self._live(seq, token):
                heapq.heappush(self._due, (seq, token))
        while self._due and not self._live(*self._due[0]):
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def next_deadline_s(self) -> float | None:
        """The earliest redelivery deadline (already passed when something is due)."""
        while self._due and not self._live(*self._due[0]):
            heapq.heappop(self._due)
        while self._timers and not self._live(self._timers[0][1], self._timers[0][2]):
            heapq.heappop(self._timers)
        candidates = [self._entries[seq].deadline_s for seq, _ in self._due[:1]]
        candidates += [deadline_s for deadline_s, _, _ in self._timers[:1]]
        return min(candidates, default=None)

    def redelivered(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.deliveries > 1)

    def _live(self, seq: int, token: int) -> bool:
        entry = self._entries.get(seq)
        return entry is not None and entry.token == token

    def _push_timer(self, seq: int, entry: Delivery) -> None:
        heapq.heappush(self._timers, (entry.deadline_s, seq, entry.token))
        self._rebuild_if_stale()

    def _rebuild_if_stale(self) -> None:
        if len(self._timers) + len(self._due) > 2 * len(self._entries) + 64:
            # Stale entries outnumber live ones (e.g. InProgress in a loop): rebuild.
            self._timers = [(e.deadline_s, s, e.token) for s, e in self._entries.items()]
            heapq.heapify(self._timers)
            self._due = []


@dataclass
class DeliveryState:
    config: consumers_pb2.ConsumerConfig  # normalised (consumer_config.validate_config)
    created_ms: int
    delivered_seq: int
    pending: PendingSet = field(default_factory=PendingSet)
    acked: set[int] = field(default_factory=set)
    start_seqs: deque[int] = field(default_factory=deque)
    start_resume_seq: int = 0
    num_dead_lettered: int = 0
    restored_last_seq: int = 0  # see the module docstring: settling seqs above the cursor

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ack_floor(self) -> int:
        lowest = self.pending.lowest()
        return self.delivered_seq if lowest is None else min(lowest - 1, self.delivered_seq)

    @property
    def undelivered_from_seq(self) -> int:
        """First seq the cursor has not passed, after any LAST_PER_SUBJECT start set."""
        return max(self.delivered_seq, self.start_resume_seq) + 1

    # ----------------------------------------------------------------- delivering

    def wait_s(self, *, deliveries: int) -> float:
        """How long after its `deliveries`-th delivery a message is due again."""
        backoff = self.config.backoff_ms
        if backoff:
            return backoff[min(deliveries, len(backoff)) - 1] / 1000
        return self.config.ack_wait_ms / 1000

    def exhausted(self, seq: int) -> bool:
        entry = self.pending.get(seq)
        max_deliver = self.config.max_deliver
        return entry is not None and max_deliver > 0 and entry.deliveries >= max_deliver

    def deliver(self, seq: int, *, now_s: float) -> int:
        """Hands out seq (new, or a redelivery of a pending one); returns its deliver count."""
        entry = self.pending.get(seq)
        if entry is not None:
            count = entry.deliveries + 1
            self.pending.reschedule(seq, deliveries=count,
                                    deadline_s=now_s + self.wait_s(deliveries=count))
            return count
        if seq <= self.delivered_seq:
            raise InvariantViolation(f"consumer {self.name}: seq {seq} delivered again "
                                     f"below the cursor {self.delivered_seq}")
        self.pending.add(seq, deliveries=1, deadline_s=now_s + self.wait_s(deliveries=1))
        self._move_cursor(seq)
        return 1

    def deliver_new(self, seqs: Sequence[int], *, now_s: float) -> None:
        """`deliver` of new seqs (ascending, above the cursor) in one step."""
        if not seqs:
            return
        if seqs[0] <= self.delivered_seq:
            raise InvariantViolation(f"consumer {self.name}: seq {seqs[0]} delivered again "
                                     f"below the cursor {self.delivered_seq}")
        self.pending.add_new(seqs, deadline_s=now_s + self.wait_s(deliveries=1))
        self._move_cursor(seqs[-1])

    def skip_to(self, seq: int) -> None:
        """Moves the cursor past seqs that turned out not to need delivery."""
        if seq > self.delivered_seq:
            self._move_cursor(seq)

    def _move_cursor(self, seq: int) -> None:
        self.delivered_seq = seq
        while self.start_seqs and self.start_seqs[0] <= seq:
            self.start_seqs.popleft()
        if not self.start_seqs:
            self.delivered_seq = max(self.delivered_seq, self.start_resume_seq)

    def delivery_paused(self, *, acked_max: int) -> bool:
        """Too many acks above a stuck floor: new deliveries wait until the floor moves. Acks
        ahead of the cursor do not count: only delivering lets the floor reach them."""
        if len(self.acked) < acked_max:
            return False
        self.prune_acked()
        return sum(1 for seq in self.acked if seq <= self.delivered_seq) >= acked_max

    # ----------------------------------------------------------------- acknowledging

    def refusal(self, seq: int, *, commit_seq: int,
                may_hold: Callable[[int], bool]) -> RaftlogError | None:
        """Why `seq` may not be settled by this consumer, or None when it may (the rule is in
        the module docstring). `may_hold(seq)`: the seq's message is gone or the filter matches
        it."""
        floor = self.ack_floor
        if seq <= floor or seq in self.pending or seq in self.acked:
            return None
        if seq > self.delivered_seq and seq <= self.restored_last_seq:
            if seq > commit_seq:
                return RaftlogError(
                    Reason.CATCHING_UP,
                    f"seq {seq} is above this primary's commit seq {commit_seq} (it took the "
                    "stream over and is still catching up); retry", seq=seq,
                    commit_seq=commit_seq)
            if may_hold(seq):
                return None
        return RaftlogError(
            Reason.NOT_DELIVERED,
            f"seq {seq} is not awaiting an ack from consumer {self.name!r} "
            f"(delivered up to {self.delivered_seq}, ack floor {floor})",
            seq=seq, delivered_seq=self.delivered_seq, ack_floor=floor,
        )

    def refusals(self, seqs: Sequence[int], *, commit_seq: int,
                 may_hold: Callable[[int], bool]) -> tuple[list[int], dict[int, RaftlogError]]:
        """(the distinct seqs that may be settled, the refused ones with why), all judged on
        the state before the call: the answer does not depend on the order of the seqs."""
        accepted: list[int] = []
        refused: dict[int, RaftlogError] = {}
        room = limits.acked_above_floor_max - len(self.acked)  # for acks ahead of the cursor
        for seq in dict.fromkeys(seqs):
            error = self.refusal(seq, commit_seq=commit_seq, may_hold=may_hold)
            if error is None and seq > self.delivered_seq and seq not in self.acked:
                room -= 1
                if room < 0:
                    error = RaftlogError(
                        Reason.OVERLOADED, f"consumer {self.name!r} holds "
                        f"{limits.acked_above_floor_max} acks above its ack floor "
                        f"{self.ack_floor}; ack the lower seqs first", seq=seq,
                        limit=limits.acked_above_floor_max)
            if error is None:
                accepted.append(seq)
            else:
                refused[seq] = error
        return accepted, refused

    def ack(self, seqs: Sequence[int], *, commit_seq: int, may_hold: Callable[[int], bool]
            ) -> tuple[list[int], dict[int, RaftlogError]]:
        """Ack (or Term), per seq: (the seqs that became done, the refused seqs with why)."""
        distinct = list(dict.fromkeys(seqs))
        if self.pending.remove_all(distinct):  # the usual: each one was handed out, none acked
            self.acked.update(distinct)
            return distinct, {}
        accepted, refused = self.refusals(seqs, commit_seq=commit_seq, may_hold=may_hold)
        return [seq for seq in accepted if self._done(seq) or self._done_ahead(seq)], refused

    def nak(self, seqs: Sequence[int], *, delay_s: float, now_s: float, commit_seq: int,
            may_hold: Callable[[int], bool]
            ) -> tuple[int, list[int], dict[int, RaftlogError]]:
        """Per seq: (seqs changed, seqs that exhausted max_deliver and must be dead-lettered,
        the refused seqs with why). A seq not pending here (done, or ahead of the cursor)
        changes nothing: it is not handed out again, or handed out as new."""
        changed, exhausted = 0, []
        accepted, refused = self.refusals(seqs, commit_seq=commit_seq, may_hold=may_hold)
        for seq in accepted:
            if seq not in self.pending:
                continue
            changed += 1
            if self.exhausted(seq):
                exhausted.append(seq)
            else:
                self.pending.reschedule(seq, deadline_s=now_s + delay_s)
        return changed, exhausted, refused

    def in_progress(self, seqs: Sequence[int], *, now_s: float, commit_seq: int,
                    may_hold: Callable[[int], bool]) -> tuple[int, dict[int, RaftlogError]]:
        """Per seq: restarts the ack wait of each pending seq; (seqs changed, refused)."""
        changed = 0
        accepted, refused = self.refusals(seqs, commit_seq=commit_seq, may_hold=may_hold)
        for seq in accepted:
            entry = self.pending.get(seq)
            if entry is not None:
                deadline_s = now_s + self.wait_s(deliveries=entry.deliveries)
                self.pending.reschedule(seq, deadline_s=deadline_s)
                changed += 1
        return changed, refused

    def dead_letter(self, seq: int) -> bool:
        """Gives up on a pending seq; False if it was acked meanwhile."""
        if not self._done(seq):
            return False
        self.num_dead_lettered += 1
        return True

    def drop_removed(self, seq: int) -> None:
        """A pending message was removed from the stream: nothing left to deliver."""
        self._done(seq)

    def forget_removed(self, *, first_seq: int, exists: Callable[[int], bool]) -> None:
        """After messages were removed under the consumer: skip them, move the floor."""
        for seq, _ in list(self.pending.items()):
            if seq < first_seq or not exists(seq):
                self.drop_removed(seq)
        self.start_seqs = deque(seq for seq in self.start_seqs if seq >= first_seq and exists(seq))
        # Also ends the LAST_PER_SUBJECT start phase when its last seqs were removed.
        self._move_cursor(max(self.delivered_seq, first_seq - 1))
        self.prune_acked()

    def _done(self, seq: int) -> bool:
        if self.pending.remove(seq) is None:
            return False
        self.acked.add(seq)
        return True

    def _done_ahead(self, seq: int) -> bool:
        """An ack of a seq above the cursor (an earlier primary may have handed it out)."""
        if seq <= self.delivered_seq or seq in self.acked:
            return False
        self.acked.add(seq)
        return True

    def acked_ahead(self) -> bool:
        """Whether a seq above the cursor is acked (after a failover): only then can the cursor
        move past acked seqs before a fetch does."""
        delivered_seq = self.delivered_seq
        return any(seq > delivered_seq for seq in self.acked)

    def skip_acked_ahead(self, seq: int) -> bool:
        """At delivery: True, and the cursor moves past seq, when seq was acked ahead of the
        cursor (it is never handed out again)."""
        if seq not in self.acked:
            return False
        self.skip_to(seq)
        return True

    def is_done(self, seq: int) -> bool:
        """This consumer needs nothing more of seq: at or below the ack floor, or acked."""
        return seq <= self.ack_floor or seq in self.acked

    def prune_acked(self) -> None:
        floor = self.ack_floor
        self.acked = {seq for seq in self.acked if seq > floor}

    # ----------------------------------------------------------------- reporting and records

    def snapshot(self, *, num_pending: int) -> consumers_pb2.ConsumerState:
        return consumers_pb2.ConsumerState(
            delivered_seq=self.delivered_seq,
            ack_floor=self.ack_floor,
            num_pending=num_pending,
            num_ack_pending=len(self.pending),
            num_redelivered=self.pending.redelivered(),
            num_dead_lettered=self.num_dead_lettered,
        )

    def to_record(self) -> storage_pb2.ConsumerRecord:
        self.prune_acked()
        return storage_pb2.ConsumerRecord(
            config=self.config,
            created_ms=self.created_ms,
            delivered_seq=self.delivered_seq,
            ack_floor=self.ack_floor,
            acked=sorted(self.acked),
            deliveries={seq: entry.deliveries for seq, entry in self.pending.items()},
            num_dead_lettered=self.num_dead_lettered,
            start_seqs=list(self.start_seqs),
            start_resume_seq=self.start_resume_seq,
        )

    @classmethod
    def from_record(cls, record: storage_pb2.ConsumerRecord, *, now_s: float) -> DeliveryState:
        """Restores a saved state; pending deliveries get a fresh ack-wait deadline."""
        state = cls(config=record.config, created_ms=record.created_ms,
                    delivered_seq=record.delivered_seq,
                    acked={seq for seq in record.acked if seq > record.ack_floor},
                    start_seqs=deque(record.start_seqs),
                    start_resume_seq=record.start_resume_seq,
                    num_dead_lettered=record.num_dead_lettered)
        for seq in sorted(record.deliveries):
            count = record.deliveries[seq]
            state.pending.add(seq, deliveries=count,
                              deadline_s=now_s + state.wait_s(deliveries=count))
        state.check_record(record)
        return state

    def check_record(self, record: storage_pb2.ConsumerRecord) -> None:
        problems = []
        if self.ack_floor != record.ack_floor:
            problems.append(f"ack_floor {record.ack_floor} but its contents imply {self.ack_floor}")
        if any(seq > self.delivered_seq for seq, _ in self.pending.items()):
            problems.append("a delivery above delivered_seq")
        if self.start_seqs and (self.start_seqs[0] <= self.delivered_seq
                                or list(self.start_seqs) != sorted(set(self.start_seqs))):
            problems.append("start_seqs not ascending above delivered_seq")
        if problems:
            raise RaftlogError(Reason.CORRUPT_RECORD,
                               f"consumer record {self.name!r}: {'; '.join(problems)}",
                               consumer=self.name)
