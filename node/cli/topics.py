"""`raftlog topic ...`: topics of N partition streams (create, ls, info, rm), publishing by key
or partition, and a topic's consumer groups and their offsets, through the raftlog.v1 Topics
service (docs/partitions.md).

A key or value on the command line is UTF-8 text, or `base64:...`.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import EXIT_OK, emit, group, leaf, non_negative, positive, typed
from raftlog.node.cli.client import Client
from raftlog.v1 import consumers_pb2, topics_pb2, topics_pb2_grpc, types_pb2


def add_topic_commands(commands: Any) -> None:
    topic = group(commands, "topic", "topics: N partition streams, keys hashed to partitions")
    create = leaf(topic, "create", _create, "create a topic (or complete one cut short)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=positive, required=True, metavar="N")
    create.add_argument("--replicas", type=non_negative, default=0, metavar="N",
                        help="copies of each partition (default 3, capped by the cluster size)")
    create.add_argument("--max-age", type=typed(fmt.parse_duration_ms), default=0,
                        metavar="DURATION",
                        help="drop messages older than this, e.g. 24h (default: kept)")
    leaf(topic, "ls", _ls, "list topics")
    leaf(topic, "info", _info, "show a topic and its partitions").add_argument(
        "name", metavar="NAME")
    leaf(topic, "rm", _rm, "delete a topic: every partition with its messages").add_argument(
        "name", metavar="NAME")
    publish = leaf(topic, "publish", _publish, "publish one message to a topic")
    publish.add_argument("name", metavar="NAME")
    publish.add_argument("value", metavar="VALUE")
    target = publish.add_mutually_exclusive_group()
    target.add_argument("--key", metavar="KEY", help="hashed to a partition (default: random)")
    target.add_argument("--partition", type=non_negative, metavar="P")
    publish.add_argument("--subject", default="", help="default: the topic name")
    group_add = leaf(topic, "group-add", _group_add, "a consumer group on every partition")
    group_add.add_argument("name", metavar="NAME")
    group_add.add_argument("group", metavar="GROUP")
    group_add.add_argument("--ack-wait", type=typed(fmt.parse_duration_ms), default=0,
                           metavar="DURATION", help="redeliver after this (default 30s)")
    group_add.add_argument("--max-ack-pending", type=non_negative, default=0, metavar="N",
                           help="unacked messages per partition (default 1000; 1 keeps "
                                "each partition's order, a RocketMQ FIFO group)")
    group_add.add_argument("--max-deliver", type=non_negative, default=0, metavar="N",
                           help="deliveries before a message is given up (default unlimited; "
                                "a RocketMQ group gets N - 1 attempts before %%DLQ%%)")
    offsets = leaf(topic, "offsets", _offsets, "a group's position in every partition")
    offsets.add_argument("name", metavar="NAME")
    offsets.add_argument("group", metavar="GROUP")
    seek = leaf(topic, "seek", _seek, "set a group's ack floor in one partition")
    seek.add_argument("name", metavar="NAME")
    seek.add_argument("group", metavar="GROUP")
    seek.add_argument("partition", type=non_negative, metavar="P")
    seek.add_argument("ack_floor", type=non_negative, metavar="SEQ")


def _stub(client: Client) -> Any:
    return topics_pb2_grpc.TopicsStub(client.channel)  # type: ignore[no-untyped-call]


def _bytes(text: str) -> bytes:
    if text.startswith("base64:"):
        return base64.b64decode(text[len("base64:"):])
    return text.encode()


def _topic_text(info: topics_pb2.TopicInfo) -> str:
    state = "complete" if info.complete else "INCOMPLETE (create it again to repair)"
    lines = [f"topic {info.name}: {info.partitions} partitions, {state}"]
    for part in info.partition_infos:
        if part.HasField("info"):
            lines.append(f"  {part.partition:>4}  {part.stream}  "
                         f"last seq {part.info.state.last_seq}")
        else:
            lines.append(f"  {part.partition:>4}  {part.stream}  MISSING")
    return "\n".join(lines)


async def _create(client: Client, args: argparse.Namespace) -> int:
    request = topics_pb2.CreateTopicRequest(name=args.name, partitions=args.partitions,
                                            config=types_pb2.StreamConfig(
                                                replicas=args.replicas,
                                                max_age_ms=args.max_age))
    info = await _stub(client).CreateTopic(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: _topic_text(info))
    return EXIT_OK


async def _ls(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListTopics(topics_pb2.ListTopicsRequest(),
                                           timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "\n".join(
        f"{t.name}  {t.partitions} partitions{'' if t.complete else '  INCOMPLETE'}"
        for t in reply.topics) or "(no topics)")
    return EXIT_OK


async def _info(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).GetTopic(topics_pb2.GetTopicRequest(name=args.name),
                                        timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: _topic_text(info))
    return EXIT_OK


async def _rm(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).DeleteTopic(topics_pb2.DeleteTopicRequest(name=args.name),
                                            timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply),
         lambda: f"deleted topic {args.name} ({reply.deleted} partition streams)")
    return EXIT_OK


async def _publish(client: Client, args: argparse.Namespace) -> int:
    request = topics_pb2.PublishToTopicRequest(topic=args.name, payload=_bytes(args.value),
                                               subject=args.subject)
    if args.key is not None:
        request.key = _bytes(args.key)
    elif args.partition is not None:
        request.partition = args.partition
    reply = await _stub(client).PublishToTopic(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply),
         lambda: f"partition {reply.partition} seq {reply.seq}"
         + (f" (primary {reply.primary})" if reply.primary else ""))
    return EXIT_OK


async def _group_add(client: Client, args: argparse.Namespace) -> int:
    request = topics_pb2.CreateTopicGroupRequest(
        topic=args.name, config=consumers_pb2.ConsumerConfig(
            name=args.group, ack_wait_ms=args.ack_wait, max_ack_pending=args.max_ack_pending,
            max_deliver=args.max_deliver))
    reply = await _stub(client).CreateTopicGroup(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply),
         lambda: f"group {reply.group} on {len(reply.consumers)} partitions of {reply.topic}")
    return EXIT_OK


def _offsets_text(reply: topics_pb2.TopicOffsets) -> str:
    lines = [f"{'partition':>9}  {'first':>8}  {'last':>8}  {'acked to':>8}  {'lag':>8}"]
    for p in reply.partitions:
        lag = max(p.last_seq - p.ack_floor, 0)
        lines.append(f"{p.partition:>9}  {p.first_seq:>8}  {p.last_seq:>8}  {p.ack_floor:>8}  "
                     f"{lag:>8}")
    return "\n".join(lines)


async def _offsets(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).GetTopicOffsets(
        topics_pb2.GetTopicOffsetsRequest(topic=args.name, group=args.group),
        timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: _offsets_text(reply))
    return EXIT_OK


async def _seek(client: Client, args: argparse.Namespace) -> int:
    request = topics_pb2.SetTopicOffsetsRequest(topic=args.name, group=args.group, offsets=[
        topics_pb2.PartitionFloor(partition=args.partition, ack_floor=args.ack_floor)])
    reply = await _stub(client).SetTopicOffsets(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: _offsets_text(reply))
    return EXIT_OK
