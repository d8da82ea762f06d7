"""A RocketMQ POP receive on raftlog topics (docs/rocketmq-v1.md): one long-polled read of a
group's messages from one queue, or from any queue of the topic, with an invisible duration and
a tag filter. Built on TopicOps and ConsumerOps only; the group is a topic group that
ops/rocketmq.py's RocketGroups creates on first use.

"Any queue" (a v1 receive with partition id -1): the queues are looked at in turn, starting after
the one the group's last receive here was served from, each without waiting; when all are empty
the receive waits on one queue for at most limits.rocketmq_poll_slice_ms, moves on to the next,
and looks at every queue again, until its wait is over. So one busy queue does not starve the
others, and a message on any queue is found within a slice.

"This queue, else any" (a v2 receive, `others`): the same rounds, starting at the queue the
client named. A RocketMQ broker serves a receive from any of its queues of the topic; in raftlog
each queue is a broker of its own, so without this a client that picks a queue at random for
every receive (rocketmq-python-client does) would wait out whole long polls on empty queues
while others hold messages.

What a receive does with what it fetched:
- a message whose tag the filter does not ask for is acked at once and not returned (RocketMQ
  settles filtered messages silently);
- the others stay pending for the invisible duration: when the group's ack wait differs, they
  are Nak'ed with that delay right after the fetch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import rocketmq
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.ops.rocketmq import RocketGroups
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, types_pb2

ANY_QUEUE = -1


@dataclass(frozen=True)
class Receive:
    """One receive: `queue` is a partition index or ANY_QUEUE; with `others`, a named queue
    that has nothing lets any other queue of the topic serve; `tags` None takes every tag."""

    topic: str  # raftlog topic
    group: str
    queue: int
    batch: int
    invisible_ms: int
    wait_ms: int
    tags: frozenset[str] | None
    others: bool = False

    @property
    def one_queue(self) -> bool:
        return self.queue != ANY_QUEUE and not self.others


@dataclass(frozen=True)
class Received:
    queue: int
    messages: Sequence[types_pb2.Message]


def header(message: types_pb2.Message, key: str) -> str | None:
    for entry in message.headers:
        if entry.key == key:
            return entry.value
    return None


class Receiver:
    """The receives of one node; remembers per (topic, group) where the next round starts."""

    def __init__(self, topics: TopicOps, consumers: ConsumerOps, *, groups: RocketGroups,
                 clock: Clock) -> None:
        self._topics = topics
        self._consumers = consumers
        self._groups = groups
        self._clock = clock
        self._turn: dict[tuple[str, str], int] = {}
        self._waiting: dict[tuple[str, str], int] = {}  # receives in progress here

    async def receive(self, request: Receive, via: Call) -> Received:
        """The messages found (none when the wait ran out), from one queue. OVERLOADED
        ("polling full") past limits.rocketmq_receives_waiting_max receives of the group
        and topic in progress on this node."""
        key = (request.topic, request.group)
        if self._waiting.get(key, 0) >= limits.rocketmq_receives_waiting_max:
            raise RaftlogError(Reason.OVERLOADED, f"polling full: "
                               f"{limits.rocketmq_receives_waiting_max} receives of group "
                               f"{request.group!r} on topic {request.topic!r} wait here already",
                               limit=limits.rocketmq_receives_waiting_max)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            return await self._receive(request, via)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]

    async def _receive(self, request: Receive, via: Call) -> Received:
        count = await self._topics.partitions(request.topic, via)
        if request.queue != ANY_QUEUE:
            await self._topics.stream(request.topic, request.queue, via)  # range check
        settings = await self._groups.ensure(request.topic, request.group,
                                             request.invisible_ms, via)
        give_up_at_s = self._clock.monotonic_s() + request.wait_ms / 1000
        wait_ms = request.wait_ms
        while True:  # each round settles what it fetched, so the rounds are bounded
            try:
                found = await self._poll(request, count, wait_ms, via)
            except RaftlogError as err:
                if err.reason == Reason.CONSUMER_NOT_FOUND:
                    self._groups.forget(request.topic, request.group)  # made again next time
                raise
            if found is None:
                return Received(queue=request.queue, messages=[])
            kept = await self._settle_filtered(request, found, settings.ack_wait_ms, via)
            wait_ms = int((give_up_at_s - self._clock.monotonic_s()) * 1000)
            if kept or wait_ms <= 0:  # else: every message was filtered out; poll on
                return Received(queue=found.queue, messages=kept)

    async def _poll(self, request: Receive, count: int, wait_ms: int, via: Call
                    ) -> Received | None:
        if request.one_queue:
            return await self._fetch(request, request.queue, wait_ms, via)
        turn = request.queue if request.others else \
            self._turn.get((request.topic, request.group), 0) % count
        give_up_at_s = self._clock.monotonic_s() + wait_ms / 1000
        while True:
            for step in range(count):  # a look at every queue, waiting on none
                found = await self._fetch(request, (turn + step) % count, 0, via)
                if found is not None:
                    return self._served(request, found, count)
            remaining_ms = int((give_up_at_s - self._clock.monotonic_s()) * 1000)
            if remaining_ms <= 0:
                return None
            slice_ms = remaining_ms if count == 1 else min(remaining_ms,
                                                           limits.rocketmq_poll_slice_ms)
            found = await self._fetch(request, turn, slice_ms, via)
            if found is not None:
                return self._served(request, found, count)
            turn = (turn + 1) % count

    def _served(self, request: Receive, found: Received, count: int) -> Received:
        """Where the group's next receive of any queue starts (one that names its queue,
        `others`, starts there and leaves this alone)."""
        if request.others:
            return found
        if len(self._turn) >= limits.rocketmq_groups_cached_max:
            self._turn.clear()
        self._turn[(request.topic, request.group)] = (found.queue + 1) % count
        return found

    async def _fetch(self, request: Receive, queue: int, wait_ms: int, via: Call
                     ) -> Received | None:
        """What `queue` has for the group; a queue between primaries (UNAVAILABLE) counts as
        empty for this look once `wait_ms` has passed."""
        stream = await self._topics.stream(request.topic, queue, via)
        try:
            fetched = await self._consumers.fetch(consumers_pb2.FetchRequest(
                stream=stream, consumer=request.group, batch=request.batch,
                max_wait_ms=wait_ms), via)
        except RaftlogError as err:
            if err.status_name != "UNAVAILABLE" or request.one_queue:
                raise
            await asyncio.sleep(wait_ms / 1000)
            return None
        return Received(queue=queue, messages=list(fetched.messages)) if fetched.messages \
            else None

    async def _settle_filtered(self, request: Receive, found: Received, group_wait_ms: int,
                               via: Call) -> list[types_pb2.Message]:
        stream = await self._topics.stream(request.topic, found.queue, via)
        skipped = [m.seq for m in found.messages if request.tags is not None
                   and header(m, rocketmq.TAG_HEADER) not in request.tags]
        if skipped:
            await self._consumers.ack(consumers_pb2.AckRequest(
                stream=stream, consumer=request.group, seqs=skipped), via)
        kept = [m for m in found.messages if m.seq not in set(skipped)]
        if kept and request.invisible_ms != group_wait_ms:
            await self._consumers.nak(consumers_pb2.NakRequest(
                stream=stream, consumer=request.group, seqs=[m.seq for m in kept],
                delay_ms=request.invisible_ms), via)
        return kept
