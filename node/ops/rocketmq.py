"""RocketMQ (apache.rocketmq.v2) on raftlog topics: the names, the receipt handles and the
consumer groups the front-end (node/api/rocketmq_v2.py) needs, built on `TopicOps` only.

The mapping (docs/rocketmq.md):
- a RocketMQ topic is a raftlog topic of the same name; a queue is a partition (queue id =
  partition index). RocketMQ names use `[%|A-Za-z0-9_-]` and never `.`, raftlog topics allow
  `.` but not `%`, so `%` maps to `.` (`%DLQ%orders` <-> `.DLQ.orders`) and back; `|` is
  refused.
- a group is a raftlog consumer of that name on every partition (a topic group); its ack wait
  is the invisible duration, set per delivery with a Nak delay when a receive asks for another.
- a receipt handle names the partition, the seq and the delivery count: `<partition>.<seq>.<n>`.
- offsets (pull consumers) and recall handles of delayed sends: rocketmq_offsets.py.
- a route gives every queue id 0 and its own broker, named `<node>#q<partition>` (`queue_broker`):
  rocketmq-client-nodejs 1.0.8 takes only queues whose id is 0 (it compares the queue id where
  the other clients compare the broker id), and every client tells queues apart by broker name
  and id together. A receive names its queue by that broker name (`queue_partition`).
- the message's RocketMQ properties travel as headers (`Rmq-*`), its message id as the
  publish msg_id (raftlog's dedupe key).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, topics_pb2

TAG_HEADER = "Rmq-Tag"
KEYS_HEADER = "Rmq-Keys"  # JSON list of strings
PROPERTIES_HEADER = "Rmq-Properties"  # JSON object of the user properties
BORN_HEADER = "Rmq-Born"  # "<born ms> <born host>"
GROUP_HEADER = "Rmq-Group"  # a FIFO message's message group

_GROUP_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def raftlog_topic(name: str) -> str:
    """The raftlog topic of RocketMQ topic `name` (`%` -> `.`); INVALID_NAME when it has none."""
    if "|" in name:
        raise RaftlogError(Reason.INVALID_NAME, f"topic {name!r}: '|' has no raftlog form")
    return name.replace("%", ".")


def rocketmq_topic(topic: str) -> str:
    """The RocketMQ name of raftlog topic `topic`."""
    return topic.replace(".", "%")


def group_name(name: str) -> str:
    """A RocketMQ group as a raftlog consumer name; INVALID_NAME when it has none (groups
    with '%' are RocketMQ's internal retry groups)."""
    if not _GROUP_RE.fullmatch(name):
        raise RaftlogError(Reason.INVALID_NAME, f"consumer group {name!r} may only contain "
                           "letters, digits, '_' and '-' (1 to 128)")
    return name


_QUEUE_MARK = "#q"  # between the node and the partition in a queue's broker name


def queue_broker(node: str, partition: int) -> str:
    """The broker name a route gives the queue of `partition`, served by `node` now."""
    return f"{node}{_QUEUE_MARK}{partition}"


def queue_partition(queue_id: int, broker_name: str) -> int:
    """The partition a client's message queue names: the one in its broker name when that is
    a `queue_broker` name (queue id 0), else the queue id (a queue a client built itself)."""
    _, mark, index = broker_name.rpartition(_QUEUE_MARK)
    if not mark or not (index.isascii() and index.isdigit()):
        return queue_id
    if queue_id != 0:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"message queue {queue_id} of broker "
                           f"{broker_name!r}: this server's queues have id 0",
                           field="message_queue")
    return int(index)


@dataclass(frozen=True)
class Receipt:
    """What a receipt handle names: one delivery of one message of a queue."""

    partition: int
    seq: int
    delivery: int

    def handle(self) -> str:
        return f"{self.partition}.{self.seq}.{self.delivery}"

    @classmethod
    def parse(cls, handle: str) -> Receipt:
        parts = handle.split(".")
        if len(parts) != 3 or not all(part.isascii() and part.isdigit() for part in parts):
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"receipt handle {handle!r} is not one "
                               "this server issued", field="receipt_handle")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]))


def keys_header(keys: list[str]) -> str:
    return json.dumps(keys)


def properties_header(properties: dict[str, str]) -> str:
    return json.dumps(properties, sort_keys=True)


@dataclass(frozen=True)
class GroupSettings:
    """What a RocketMQ front-end needs of a group's raftlog consumers."""

    ack_wait_ms: int  # the invisible duration a receive that names none gets
    max_deliver: int  # the raftlog consumer's; 0 = unlimited
    fifo: bool  # one message in flight per queue (max_ack_pending 1)
    backoff_ms: tuple[int, ...] = ()  # the raftlog consumer's redelivery delays, if any

    @property
    def attempts(self) -> int:
        """Deliveries before a message moves to `%DLQ%<group>`: max_deliver - 1 (at least 1),
        so the front-end moves it on the delivery after, before raftlog's own max_deliver
        would give it up; limits.rocketmq_attempts_default when max_deliver is 0."""
        if self.max_deliver <= 0:
            return limits.rocketmq_attempts_default
        return max(self.max_deliver - 1, 1)


def settings_of(config: consumers_pb2.ConsumerConfig) -> GroupSettings:
    return GroupSettings(ack_wait_ms=config.ack_wait_ms, max_deliver=config.max_deliver,
                         fifo=config.max_ack_pending == 1, backoff_ms=tuple(config.backoff_ms))


class RocketGroups:
    """Creates a group's consumers on first use (RocketMQ creates subscription groups on
    demand), remembering the groups known here with their settings. A group made beforehand
    through raftlog (`raftlog topic group-add`) keeps its config: `--max-ack-pending 1` makes
    it FIFO, `--max-deliver N` gives it N - 1 attempts before the dead-letter topic, and its
    `backoff_ms` is the retry back-off push consumers are told."""

    def __init__(self, topics: TopicOps, consumers: ConsumerOps) -> None:
        self._topics = topics
        self._consumers = consumers
        self._known: dict[tuple[str, str], GroupSettings] = {}

    async def ensure(self, topic: str, group: str, invisible_ms: int, via: Call
                     ) -> GroupSettings:
        """The group's settings on `topic`, creating the group with `invisible_ms` as its ack
        wait when it does not exist."""
        key = (topic, group)
        known = self._known.get(key)
        if known is not None:
            return known
        try:
            info = await self._topics.create_group(topics_pb2.CreateTopicGroupRequest(
                topic=topic, config=consumers_pb2.ConsumerConfig(
                    name=group, ack_wait_ms=invisible_ms,
                    max_ack_pending=limits.rocketmq_ack_pending_max)), via)
            settings = (settings_of(info.consumers[0].config) if info.consumers else
                        GroupSettings(ack_wait_ms=invisible_ms, max_deliver=0, fifo=False))
        except RaftlogError as err:
            if err.reason != Reason.CONSUMER_EXISTS:
                raise
            settings = await self.read(topic, group, via)
        self._remember(key, settings)
        return settings

    async def read(self, topic: str, group: str, via: Call) -> GroupSettings:
        """The settings of an existing group (its consumer on partition 0)."""
        stream = await self._topics.stream(topic, 0, via)
        info = await self._consumers.info(consumers_pb2.GetConsumerInfoRequest(
            stream=stream, consumer=group), via)
        return settings_of(info.config)

    async def lookup(self, topic: str, group: str, via: Call) -> GroupSettings | None:
        """The group's settings when it exists (remembered, or read); None when not."""
        known = self._known.get((topic, group))
        if known is not None:
            return known
        try:
            settings = await self.read(topic, group, via)
        except RaftlogError as err:
            if err.reason in (Reason.CONSUMER_NOT_FOUND, Reason.TOPIC_NOT_FOUND,
                              Reason.STREAM_NOT_FOUND):
                return None
            raise
        self._remember((topic, group), settings)
        return settings

    def _remember(self, key: tuple[str, str], settings: GroupSettings) -> None:
        if len(self._known) >= limits.rocketmq_groups_cached_max:
            self._known.clear()
        self._known[key] = settings

    def forget(self, topic: str, group: str) -> None:
        self._known.pop((topic, group), None)
