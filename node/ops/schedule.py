"""Scheduled (delayed) messages, whatever protocol asked: `ScheduleOps` takes a publish with a
future deliver_at_ms, lists what is waiting for a stream, and cancels one waiting message.
Layout and names: schedule_layout.py; delivery: schedule_runner.py; docs/scheduled.md.

Scheduling is an ordinary publish to the target's schedule stream (created on first use with
the target's replicas), so it is majority-committed before it is acknowledged, deduplicated
by its msg_id, and forwarded to the schedule stream's primary like any publish. It checks
first what the target would refuse at delivery (a missing stream, a subject outside its
subjects, a message above its size limit), so a message it accepts can be delivered unless the
target changes meanwhile.

A cancel runs on the schedule stream's primary, where the scheduler runs: it waits for a
delivery of that message already under way (`InFlight`), appends a cancel marker (committed on
a majority, so it survives a failover) and removes the waiting copy; a cancelled message is
never appended to the target.
"""

from __future__ import annotations

import asyncio

from raftlog.base import limits, subjects
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream import Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import route
from raftlog.node.ops import schedule_layout as layout
from raftlog.node.ops.route import Route
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.node.transport.forwarding import Forward
from raftlog.v1 import streams_pb2, types_pb2

_STREAMS = streams_pb2.DESCRIPTOR.services_by_name["Streams"]
# A cancel is sent to the schedule stream's primary by this method of the public API.
CANCEL_SCHEDULED = Forward(path=f"/{_STREAMS.full_name}/CancelScheduled",
                           parse=streams_pb2.CancelScheduledResponse.FromString)


class InFlight:
    """The schedule seqs a delivery or a cancel is working on, on this node: each is claimed
    by one of them at a time, so a cancel never answers for a message being delivered, and a
    message being cancelled is not delivered."""

    def __init__(self) -> None:
        self._released: dict[tuple[str, int], asyncio.Event] = {}

    def claim(self, schedule: str, seq: int) -> bool:
        """Claims (schedule, seq); False when someone else holds it."""
        if (schedule, seq) in self._released:
            return False
        self._released[(schedule, seq)] = asyncio.Event()
        return True

    def release(self, schedule: str, seq: int) -> None:
        released = self._released.pop((schedule, seq), None)
        if released is not None:
            released.set()

    async def claim_waiting(self, schedule: str, seq: int) -> None:
        """Claims (schedule, seq), waiting for its holder first; TIMEOUT after
        limits.scheduled_cancel_wait_ms_max."""
        deadline = asyncio.get_running_loop().time() + limits.scheduled_cancel_wait_ms_max / 1000
        while not self.claim(schedule, seq):
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self._released[(schedule, seq)].wait(),
                                       max(remaining, 0))
            except TimeoutError:
                raise RaftlogError(Reason.TIMEOUT, f"schedule seq {seq} of {schedule!r} is "
                                   "being delivered; try again", stream=schedule,
                                   seq=seq) from None


async def remove_now(stream: Stream, seqs: list[int]) -> int:
    """Removes schedule messages here and sends the removal to the replicas at once (the
    engine would otherwise pass it on with the next append), so that a primary taking over
    rarely finds a delivered or cancelled message still waiting."""
    removed = await stream.remove(seqs)
    if removed and stream.replicator is not None:
        stream.replicator.kick()
    return removed


def scheduled_message(message: types_pb2.Message) -> streams_pb2.ScheduledMessage | None:
    """The listing of one schedule stream message (None: not a waiting copy)."""
    due = layout.due_ms(layout.header_pairs(message))
    if due is None:
        return None
    return streams_pb2.ScheduledMessage(
        schedule_seq=message.seq, deliver_at_ms=due, subject=message.subject,
        size=layout.size_bytes(message), msg_id=message.msg_id, scheduled_ms=message.ts_ms)


class ScheduleOps:
    def __init__(self, streams: StreamOps, *, engine: StreamEngine, where: Route,
                 clock: Clock) -> None:
        self._streams = streams
        self._engine = engine
        self._where = where
        self._clock = clock
        self.in_flight = InFlight()  # shared with this node's schedulers

    # ------------------------------------------------------------------ publish

    async def maybe_schedule(self, request: streams_pb2.PublishRequest, via: Call
                             ) -> streams_pb2.PublishAck | None:
        """Schedules a publish due in the future; None when it is due now (publish it)."""
        if not layout.is_future(request.deliver_at_ms, now_ms=self._clock.wall_ms()):
            return None
        if request.HasField("expected_last_seq") or \
                request.HasField("expected_last_subject_seq"):
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a scheduled publish cannot expect a "
                               "last seq: the stream will have moved on when it is due",
                               field="deliver_at_ms")
        subjects.validate_subject(request.subject)
        target = await self._target(request.stream, via)
        _check_accepts(target, request)
        schedule = await self._ensure_schedule(target, via)
        ack = await self._streams.publish(layout.waiting_copy(request, schedule=schedule), via)
        ack.scheduled = True
        ack.deliver_at_ms = request.deliver_at_ms
        return ack

    async def _target(self, name: str, via: Call) -> types_pb2.StreamConfig:
        info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=name), via)
        if layout.target_of(info.config) is not None:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"{name!r} is a schedule stream: "
                               "schedule on its target instead", stream=name)
        return info.config

    async def _ensure_schedule(self, target: types_pb2.StreamConfig, via: Call) -> str:
        """The target's schedule stream, created when missing."""
        config = layout.schedule_config(target)
        try:
            info = await self._streams.info(
                streams_pb2.GetStreamInfoRequest(name=config.name), via)
        except RaftlogError as err:
            if err.reason != Reason.STREAM_NOT_FOUND:
                raise
            try:
                info = await self._streams.create(
                    streams_pb2.CreateStreamRequest(config=config), via)
            except RaftlogError as raced:
                if raced.reason != Reason.STREAM_EXISTS:
                    raise
                info = await self._streams.info(
                    streams_pb2.GetStreamInfoRequest(name=config.name), via)
        if layout.target_of(info.config) != target.name:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"stream {config.name!r}, the name of "
                               f"{target.name!r}'s schedule stream, is taken by another "
                               "stream", stream=config.name)
        return config.name

    # ------------------------------------------------------------------ list

    async def list(self, request: streams_pb2.ListScheduledRequest, via: Call
                   ) -> streams_pb2.ListScheduledResponse:
        subjects.validate_name(request.stream, what="stream")
        if request.limit > limits.scheduled_list_limit_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"limit may be at most "
                               f"{limits.scheduled_list_limit_max}", field="limit",
                               limit=limits.scheduled_list_limit_max)
        limit = request.limit or limits.scheduled_list_limit_default
        target = await self._target(request.stream, via)
        schedule = layout.schedule_stream(target.name)
        found: list[streams_pb2.ScheduledMessage] = []
        cursor = max(request.from_seq, 1)
        while len(found) < limit:
            try:
                reply = await self._streams.read_messages(streams_pb2.ReadMessagesRequest(
                    stream=schedule, from_seq=cursor, limit=limit - len(found)), via)
            except RaftlogError as err:
                if err.reason == Reason.STREAM_NOT_FOUND:
                    return streams_pb2.ListScheduledResponse()
                raise
            found.extend(item for item in map(scheduled_message, reply.messages) if item)
            cursor = reply.next_seq
            if cursor > reply.last_seq:
                return streams_pb2.ListScheduledResponse(schedule_stream=schedule,
                                                         messages=found)
        return streams_pb2.ListScheduledResponse(schedule_stream=schedule, messages=found,
                                                 next_seq=cursor)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, request: streams_pb2.CancelScheduledRequest, via: Call
                     ) -> streams_pb2.CancelScheduledResponse:
        subjects.validate_name(request.stream, what="stream")
        if request.schedule_seq == 0:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "schedule_seq must be at least 1",
                               field="schedule_seq")
        schedule = layout.schedule_stream(request.stream)

        async def local() -> streams_pb2.CancelScheduledResponse:
            return await self._cancel_here(schedule, request)

        return await route.unary(self._where, self._where.primary(schedule), CANCEL_SCHEDULED,
                                 request, via, local)

    async def _cancel_here(self, schedule: str, request: streams_pb2.CancelScheduledRequest
                           ) -> streams_pb2.CancelScheduledResponse:
        seq = request.schedule_seq
        gone = RaftlogError(Reason.MESSAGE_NOT_FOUND, f"stream {request.stream!r} has no "
                            f"scheduled message at schedule seq {seq} (delivered, cancelled "
                            "or never scheduled)", stream=request.stream, seq=seq)
        stream = self._engine.streams.get(schedule)
        if stream is None or layout.target_of(stream.config) != request.stream:
            raise gone
        stream.check_readable()
        await self.in_flight.claim_waiting(schedule, seq)
        try:
            try:
                listing = scheduled_message(stream.get_message(seq))
            except RaftlogError as err:
                if err.reason == Reason.MESSAGE_NOT_FOUND:
                    raise gone from None
                raise
            if listing is None:
                raise gone
            # The marker first, majority-committed; the removal reaches the replicas later.
            (outcome,) = await self._engine.publish(schedule, [layout.cancel_marker(seq)])
            if isinstance(outcome, RaftlogError):
                raise outcome
            await remove_now(stream, [seq])
        finally:
            self.in_flight.release(schedule, seq)
        return streams_pb2.CancelScheduledResponse(message=listing)


def _check_accepts(target: types_pb2.StreamConfig, request: streams_pb2.PublishRequest
                   ) -> None:
    """What the target would refuse at delivery is refused now."""
    if target.subjects and not subjects.matches_any(list(target.subjects), request.subject):
        raise RaftlogError(Reason.SUBJECT_NOT_IN_STREAM, f"subject {request.subject!r} is not "
                           f"accepted by stream {target.name!r}", subject=request.subject)
    size = (len(request.subject.encode()) + len(request.payload)
            + sum(len(h.key.encode()) + len(h.value.encode()) for h in request.headers))
    size_max = target.max_msg_bytes or limits.message_bytes_max
    if size > size_max:
        raise RaftlogError(Reason.MESSAGE_TOO_LARGE, f"message of {size} bytes exceeds the "
                           f"limit of {size_max} of stream {target.name!r}", size=size,
                           limit=size_max)
