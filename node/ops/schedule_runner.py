"""The schedulers of a node: each delivers the due messages of one schedule stream
(schedule_layout.py) to its target, on the schedule stream's primary only.

`ScheduleRunner` (started and stopped by server.py) looks every
limits.scheduled_reconcile_period_ms for the schedule streams this node leads, starts a
`Scheduler` for each new one and stops those of streams it lost, as sources.py does for tails.

A scheduler keeps only (due, schedule seq) per waiting message, in a heap. On start it reads the
whole schedule stream (a page of limits.scheduled_scan_page per turn of the event loop); then,
every round, the messages committed since, and delivers what is due: one PublishBatch to the
target (through the operations, so forwarded to the target's primary), then the delivered
copies are removed from the schedule stream. It sleeps until the next due time, or at most
limits.scheduled_poll_ms, on the injected clock.

Exactly once: the target copy's msg_id is the original msg_id or `sched:<schedule seq>`, so an
append repeated because its removal was lost (the primary died between the two) is absorbed by
the target's dedupe window. A starting scheduler also reads back the target's newest
limits.scheduled_takeover_scan_max messages for copies of messages that are (almost) due, and
removes those without appending again, which covers a takeover later than the window.

A delivery the target refuses for good (INVALID_ARGUMENT: its subjects or size limit changed
since the message was scheduled) is logged and the message dropped; any other failure leaves
it waiting and is tried again after limits.scheduled_retry_ms, doubling up to
limits.scheduled_retry_ms_max.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream import Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import schedule_layout as layout
from raftlog.node.ops.batches import expand_results
from raftlog.node.ops.leader_loops import ReconcileLoop
from raftlog.node.ops.schedule import InFlight, remove_now
from raftlog.node.ops.sources import leads
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport import logctx
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2

log = logging.getLogger(__name__)

_INVALID_ARGUMENT = 3  # google.rpc.Code of a PublishResult.error refused for good


def _call() -> Call:
    return Call(deadline=time.monotonic() + limits.forward_timeout_s_default)


class _DeliveryFailed(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class Scheduler:
    def __init__(self, *, streams: StreamOps, engine: StreamEngine, schedule: str, target: str,
                 clock: Clock, in_flight: InFlight) -> None:
        self._streams = streams
        self._engine = engine
        self.schedule = schedule
        self.target = target
        self._clock = clock
        self._in_flight = in_flight
        self._heap: list[tuple[int, int]] = []  # (due ms, schedule seq)
        self._read_to = 0  # every committed schedule seq up to this is in the heap (or gone)
        # Cancelled schedule seqs still stored here (a removal lost in a failover) -> the seq
        # of their cancel marker; both are removed when the message falls due.
        self._cancelled: dict[int, int] = {}
        self.delivered_total = 0
        self.dropped_total = 0

    @property
    def waiting(self) -> int:
        """Messages in the heap (a cancelled one stays until its due time)."""
        return len(self._heap)

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    async def run(self) -> None:
        """Delivers until cancelled; its lines carry the schedule stream."""
        with logctx.bind(stream=self.schedule):
            await self._run()

    async def _run(self) -> None:
        started = False
        pause_ms = limits.scheduled_retry_ms
        while True:
            try:
                if not started:
                    await self.start()
                    started = True
                await self.round()
                pause_ms = limits.scheduled_retry_ms
                await asyncio.sleep(self.wait_s())
                continue
            except _DeliveryFailed as exc:
                log.warning("scheduler %s -> %s: %s", self.schedule, self.target, exc.text)
            except RaftlogError as err:
                log.warning("scheduler %s -> %s: %s: %s", self.schedule, self.target,
                            err.reason.name, err.message)
            await asyncio.sleep(pause_ms / 1000)
            pause_ms = min(pause_ms * 2, limits.scheduled_retry_ms_max)

    def wait_s(self) -> float:
        """How long to sleep before the next round."""
        wait_ms = limits.scheduled_poll_ms
        due = self.next_due_ms()
        if due is not None:
            wait_ms = min(wait_ms, max(due - self._clock.wall_ms(), 0))
        return wait_ms / 1000

    def _stream(self) -> Stream:
        stream = self._engine.get(self.schedule)
        stream.check_readable()
        return stream

    # ------------------------------------------------------------------ the heap

    async def start(self) -> None:
        """Reads the whole schedule stream, then drops what a previous primary delivered."""
        self._heap.clear()
        self._cancelled.clear()
        self._read_to = 0
        while await self.read_new():
            await asyncio.sleep(0)
        await self._skip_delivered()

    async def read_new(self) -> int:
        """Reads one page of schedule messages committed since the last read into the heap;
        returns how many it read."""
        stream = self._stream()
        read = 0
        spent_markers: list[int] = []
        for entry in stream.scan(from_seq=self._read_to + 1, limit=limits.scheduled_scan_page):
            self._read_to = entry.seq
            read += 1
            due = layout.due_ms(entry.headers)
            if due is not None:
                heapq.heappush(self._heap, (due, entry.seq))
                continue
            cancelled = layout.cancelled_seq(entry.headers)
            if cancelled is None:
                log.warning("scheduler %s: seq %d is neither a scheduled message nor a cancel; "
                            "left alone", self.schedule, entry.seq)
            elif stream.peek_stored(cancelled) is None:
                spent_markers.append(entry.seq)  # the cancelled message is gone here too
            else:
                self._cancelled[cancelled] = entry.seq
        if spent_markers:
            await remove_now(stream, spent_markers)
        return read

    async def round(self) -> int:
        """Reads what is new, delivers what is due; returns how many messages it appended
        (a copy the target already held is not counted)."""
        while await self.read_new() >= limits.scheduled_scan_page:
            await asyncio.sleep(0)
        now_ms = self._clock.wall_ms()
        delivered = 0
        deferred: list[tuple[int, int]] = []  # claimed by a cancel: looked at next round
        try:
            while self._heap and self._heap[0][0] <= now_ms:
                mine: list[tuple[int, int]] = []
                for item in self._pop_due(now_ms):
                    claimed = self._in_flight.claim(self.schedule, item[1])
                    (mine if claimed else deferred).append(item)
                try:
                    delivered += await self._deliver(mine)
                finally:
                    for _, seq in mine:
                        self._in_flight.release(self.schedule, seq)
        finally:
            for item in deferred:
                heapq.heappush(self._heap, item)
        return delivered

    def _pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        due: list[tuple[int, int]] = []
        while self._heap and self._heap[0][0] <= now_ms and \
                len(due) < limits.scheduled_deliver_batch_max:
            due.append(heapq.heappop(self._heap))
        return due

    # ------------------------------------------------------------------ delivery

    async def _deliver(self, due: list[tuple[int, int]]) -> int:
        """Appends a batch of due messages (claimed in InFlight); see round()."""
        stream = self._stream()
        batch: list[tuple[int, int, streams_pb2.PublishEntry]] = []
        size = 0
        cancelled = [(seq, self._cancelled.pop(seq)) for _, seq in due if seq in self._cancelled]
        if cancelled:
            await remove_now(stream, [seq for pair in cancelled for seq in pair])
            due = [item for item in due if item[1] not in dict(cancelled)]
        for position, (due_ms, seq) in enumerate(due):
            try:
                message = stream.get_message(seq)
            except RaftlogError as err:
                if err.reason == Reason.MESSAGE_NOT_FOUND:
                    continue  # cancelled
                raise
            entry = layout.delivered_copy(message, due=due_ms)
            size += entry.ByteSize()
            if batch and size > limits.scheduled_deliver_bytes_max:
                for later in due[position:]:
                    heapq.heappush(self._heap, later)  # the next batch
                break
            batch.append((due_ms, seq, entry))
        if not batch:
            return 0
        return await self._append(stream, batch)

    async def _append(self, stream: Stream, batch: list[tuple[int, int, streams_pb2.PublishEntry]]
                      ) -> int:
        request = streams_pb2.PublishBatchRequest(stream=self.target,
                                                  entries=[entry for _, _, entry in batch])
        try:
            reply = await self._streams.publish_batch(request, _call())
        except RaftlogError:
            for due_ms, seq, _ in batch:
                heapq.heappush(self._heap, (due_ms, seq))
            raise
        done: list[int] = []
        failed: list[str] = []
        appended = 0
        for (due_ms, seq, entry), result in zip(batch, expand_results(reply), strict=True):
            if result.HasField("ack"):
                done.append(seq)
                appended += 0 if result.ack.duplicate else 1
            elif result.error.code == _INVALID_ARGUMENT:
                log.warning("scheduler %s: %s refused schedule seq %d (subject %r) for good, "
                            "dropped: %s: %s", self.schedule, self.target, seq, entry.subject,
                            result.error.reason, result.error.message)
                done.append(seq)
                self.dropped_total += 1
            else:
                heapq.heappush(self._heap, (due_ms, seq))
                failed.append(f"{result.error.reason}: {result.error.message}")
        if done:
            await remove_now(stream, done)
        self.delivered_total += appended
        if failed:
            raise _DeliveryFailed(f"appending to {self.target!r} failed: {failed[0]}")
        return appended

    # ------------------------------------------------------------------ takeover

    async def _skip_delivered(self) -> None:
        """Removes waiting messages whose copy is already in the target's newest messages."""
        horizon_ms = self._clock.wall_ms() + limits.scheduled_clock_skew_ms_max
        suspects = {seq for due_ms, seq in self._heap if due_ms <= horizon_ms}
        if not suspects:
            return
        info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=self.target),
                                        _call())
        last = info.state.last_seq
        cursor = max(info.state.first_seq, last - limits.scheduled_takeover_scan_max + 1, 1)
        copies: dict[int, set[str]] = {}  # schedule seq -> msg_ids of messages naming it
        while cursor <= last:
            reply = await self._streams.read_messages(streams_pb2.ReadMessagesRequest(
                stream=self.target, from_seq=cursor, limit=limits.scan_limit_max), _call())
            for message in reply.messages:
                seq = layout.schedule_seq_of(message)
                if seq is not None and seq in suspects:
                    copies.setdefault(seq, set()).add(message.msg_id)
            if reply.next_seq <= cursor:
                break
            cursor = reply.next_seq
        found = self._confirmed_copies(copies)
        if found:
            log.info("scheduler %s: %d messages were delivered before the takeover",
                     self.schedule, len(found))
            await remove_now(self._stream(), sorted(found))
            self._heap = [item for item in self._heap if item[1] not in found]
            heapq.heapify(self._heap)


    def _confirmed_copies(self, copies: dict[int, set[str]]) -> set[int]:
        """The seqs whose target copy has the msg_id a delivery gives (a message that only
        carries the header, e.g. copied by a stream source from another target, is not one)."""
        stream = self._stream()
        found: set[int] = set()
        for seq, msg_ids in copies.items():
            waiting = stream.peek_stored(seq)
            if waiting is not None and \
                    (waiting.msg_id or f"{layout.MSG_ID_PREFIX}{seq}") in msg_ids:
                found.add(seq)
        return found


@dataclass
class _Running:
    stream_id: int  # a schedule stream deleted and created again is another
    scheduler: Scheduler
    task: asyncio.Task[None]


class ScheduleRunner(ReconcileLoop[str]):
    def __init__(self, *, streams: StreamOps, engine: StreamEngine, clock: Clock,
                 in_flight: InFlight) -> None:
        super().__init__(period_s=limits.scheduled_reconcile_period_ms / 1000,
                         what="schedulers")
        self._streams = streams
        self._engine = engine
        self._clock = clock
        self._in_flight = in_flight
        self._running: dict[str, _Running] = {}

    @property
    def running(self) -> dict[str, _Running]:
        return self._running

    def reconcile(self) -> None:
        """Starts a scheduler for each schedule stream this node leads, stops the others."""
        wanted: dict[str, tuple[int, str]] = {}
        for name, stream in list(self._engine.streams.items()):
            target = layout.target_of(stream.config)
            if target is not None and leads(stream):
                wanted[name] = (stream.stream_id, target)
        for name, running in list(self.running.items()):
            want = wanted.get(name)
            if want is None or want[0] != running.stream_id or running.task.done():
                self._stop(name)
        for name, (stream_id, target) in wanted.items():
            if name not in self.running:
                self._begin(name, stream_id, target)

    def _begin(self, name: str, stream_id: int, target: str) -> None:
        scheduler = Scheduler(streams=self._streams, engine=self._engine, schedule=name,
                              target=target, clock=self._clock, in_flight=self._in_flight)
        task = asyncio.get_running_loop().create_task(scheduler.run(), name=f"schedule {name}")
        self.running[name] = _Running(stream_id=stream_id, scheduler=scheduler, task=task)
        log.info("scheduler %s -> %s started", name, target, extra=logctx.fields(stream=name))

    def _stop(self, name: str) -> None:
        running = self.running.pop(name)
        running.task.cancel()
        running.task.add_done_callback(_report_end)
        log.info("scheduler %s stopped", name, extra=logctx.fields(stream=name))


def _report_end(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        error = task.exception()
        if error is not None:
            log.error("%s ended with %r", task.get_name(), error)
