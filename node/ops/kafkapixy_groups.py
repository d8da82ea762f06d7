"""Kafka-Pixy's consumer groups over topics (docs/kafkapixy.md): the state the KafkaPixy
front-end keeps on a node, and the consume-one-message loop across a topic's partitions.

A Kafka-Pixy group of a topic is a topic group (ops/partitions.py): a durable consumer on every
partition stream, named after the group (`consumer_name`). Everything that must survive a
crash (delivered and acknowledged seqs, the ack floor) is the consumer's own Raft-committed
state; this module keeps only what a node may forget at any time:
- which (topic, group) pairs it has seen exist (so a consume does not look the group up),
- where the next consume of a pair starts its round over the partitions,
- how many consumes of a pair are waiting here (at most limits.kafkapixy_waiting_max).

Offsets: Kafka offsets start at 0, raftlog seqs at 1, so `offset = seq - 1` and the offset a
group reads next (Kafka's committed offset) equals the consumer's ack floor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from raftlog.base import limits, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, types_pb2

T = TypeVar("T")
_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


def consumer_name(group: str) -> str:
    """The consumer that holds `group` on each partition: the group name with '_' written
    '__' and '.' written '_d' (consumer names allow neither '.' nor ambiguity). Other
    characters outside [A-Za-z0-9_-] are INVALID_ARGUMENT."""
    if not group:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "group is empty", field="group")
    out = []
    for char in group:
        if char == "_":
            out.append("__")
        elif char == ".":
            out.append("_d")
        elif char in _NAME_OK:
            out.append(char)
        else:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"group {group!r} may only contain "
                               "letters, digits, '.', '_' and '-'", field="group")
    name = "".join(out)
    if len(name) > limits.name_bytes_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "group name is too long",
                           field="group", limit=limits.name_bytes_max)
    return name


def group_of(consumer: str) -> str | None:
    """The group whose consumer is named `consumer`; None for a name `consumer_name` never
    makes (e.g. a lone '_')."""
    out, at = [], 0
    while at < len(consumer):
        char = consumer[at]
        if char != "_":
            out.append(char)
            at += 1
            continue
        pair = consumer[at + 1:at + 2]
        if pair not in ("_", "d"):
            return None
        out.append("_" if pair == "_" else ".")
        at += 2
    return "".join(out) or None


def new_group_config(group: str) -> consumers_pb2.ConsumerConfig:
    """What a consume creates for a group the cluster has never seen: Kafka-Pixy's defaults
    (start at the newest message, 5 min ack timeout, 300 unacked per partition)."""
    return consumers_pb2.ConsumerConfig(
        name=consumer_name(group), deliver_policy=consumers_pb2.DELIVER_POLICY_NEW,
        ack_wait_ms=limits.kafkapixy_ack_wait_ms, max_ack_pending=limits.kafkapixy_pending_max,
        description=f"Kafka-Pixy group {group!r}")


@dataclass(frozen=True)
class Delivery:
    partition: int
    message: types_pb2.Message

    @property
    def offset(self) -> int:
        return self.message.seq - 1


async def _each(calls: Sequence[Awaitable[T]]) -> list[T]:
    gate = asyncio.Semaphore(limits.topic_fanout_max)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))


class KafkaGroups:
    def __init__(self, topics_ops: TopicOps, consumers: ConsumerOps, *, clock: Clock) -> None:
        self._topics = topics_ops
        self._consumers = consumers
        self._clock = clock
        self._known: set[tuple[str, str]] = set()  # (topic, group) seen to exist
        self._turn: dict[tuple[str, str], int] = {}  # the partition the next round starts at
        self._waiting: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------------ groups

    async def join(self, topic: str, group: str, via: Call) -> int:
        """Makes sure `group` has its consumer on every partition of `topic` (creating the
        missing ones with new_group_config; a group made through raftlog.v1 keeps its own
        config); returns the partition count."""
        count = await self._topics.partitions(topic, via)
        if (topic, group) in self._known:
            return count
        config = new_group_config(group)

        async def ensure(partition: int) -> None:
            stream = topics.partition_stream(topic, partition)
            try:
                await self._consumers.info(consumers_pb2.GetConsumerInfoRequest(
                    stream=stream, consumer=config.name), via)
                return
            except RaftlogError as err:
                if err.reason != Reason.CONSUMER_NOT_FOUND:
                    raise
            try:
                await self._consumers.create(consumers_pb2.CreateConsumerRequest(
                    stream=stream, config=config), via)
            except RaftlogError as refused:
                if refused.reason != Reason.CONSUMER_EXISTS:  # made meanwhile, elsewhere
                    raise

        await _each([ensure(partition) for partition in range(count)])
        if len(self._known) >= limits.kafkapixy_groups_cached_max:
            self._known.clear()
            self._turn.clear()
        self._known.add((topic, group))
        return count

    def forget(self, topic: str) -> None:
        """Drops what this node remembers of `topic`'s groups (e.g. after a call found a
        consumer missing)."""
        for pair in [pair for pair in self._known if pair[0] == topic]:
            self._known.discard(pair)

    # ------------------------------------------------------------------ consume

    async def consume(self, topic: str, group: str, *, wait_ms: int, via: Call
                      ) -> Delivery | None:
        """One message of `group` from any partition of `topic`, waiting up to `wait_ms`;
        None when none came. Partitions are taken in turn, so one busy partition does not
        starve the others. OVERLOADED past limits.kafkapixy_waiting_max waiting calls."""
        key = (topic, group)
        if self._waiting.get(key, 0) >= limits.kafkapixy_waiting_max:
            raise RaftlogError(Reason.OVERLOADED, f"{limits.kafkapixy_waiting_max} consume "
                               f"requests of group {group!r} on topic {topic!r} wait here "
                               "already", limit=limits.kafkapixy_waiting_max)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            return await self._consume(topic, group, wait_ms=wait_ms, via=via)
        except RaftlogError as err:
            if err.reason in (Reason.CONSUMER_NOT_FOUND, Reason.STREAM_NOT_FOUND):
                self.forget(topic)  # deleted meanwhile: the next call creates it again
            raise
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]

    async def _consume(self, topic: str, group: str, *, wait_ms: int, via: Call
                       ) -> Delivery | None:
        count = await self.join(topic, group, via)
        consumer = consumer_name(group)
        give_up_at_s = self._clock.monotonic_s() + wait_ms / 1000
        turn = self._turn.get((topic, group), 0) % count
        while True:
            for step in range(count):  # a look at every partition, waiting on none
                found = await self._fetch(topic, (turn + step) % count, consumer, 0, via)
                if found is not None:
                    self._turn[(topic, group)] = (found.partition + 1) % count
                    return found
            remaining_ms = int((give_up_at_s - self._clock.monotonic_s()) * 1000)
            if remaining_ms <= 0:
                return None
            # Then a wait on one partition (all of the time left when there is only one).
            wait = remaining_ms if count == 1 else min(remaining_ms,
                                                       limits.kafkapixy_poll_slice_ms)
            found = await self._fetch(topic, turn, consumer, wait, via)
            if found is not None:
                self._turn[(topic, group)] = (found.partition + 1) % count
                return found
            turn = (turn + 1) % count

    async def _fetch(self, topic: str, partition: int, consumer: str, wait_ms: int,
                     via: Call) -> Delivery | None:
        """At most one message of `partition`; a partition between primaries (UNAVAILABLE)
        counts as empty for this look (after waiting out `wait_ms`, bounded)."""
        try:
            reply = await self._consumers.fetch(consumers_pb2.FetchRequest(
                stream=topics.partition_stream(topic, partition), consumer=consumer, batch=1,
                max_wait_ms=wait_ms), via)
        except RaftlogError as err:
            if err.status_name != "UNAVAILABLE":
                raise
            await asyncio.sleep(wait_ms / 1000)
            return None
        if not reply.messages:
            return None
        return Delivery(partition=partition, message=reply.messages[0])

    # ------------------------------------------------------------------ ack

    async def ack(self, topic: str, group: str, *, partition: int, offset: int, via: Call
                  ) -> None:
        """Acknowledges offset `offset` of `partition` (seq offset + 1). An offset acked
        before succeeds again; one never delivered to the group is NOT_DELIVERED."""
        if partition < 0 or offset < 0:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "invalid ack: bad partition/offset",
                               partition=partition, offset=offset)
        stream = await self._topics.stream(topic, partition, via)
        reply = await self._consumers.ack(consumers_pb2.AckRequest(
            stream=stream, consumer=consumer_name(group), seqs=[offset + 1]), via)
        for result in reply.results:
            if result.HasField("error"):
                reason = Reason.__members__.get(result.error.reason, Reason.INTERNAL)
                raise RaftlogError(reason, result.error.message, **result.error.metadata)
