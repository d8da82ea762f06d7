"""Benchmark of raftlog's protocol front-ends beside raftlog.v1, in one run on one local 3-node
cluster (node/cli/localcluster.py, free loopback ports, stopped by pid at the end): 128-byte
messages produced one call at a time from one client (and batched where the protocol has a
batch form), then consumed and acked; msgs/s and per-call p50 for each, and the ratio to the
raftlog.v1 figure of the same pattern measured in the same run.

    raftlog.v1 stream   Streams.Publish / PublishBatch (100), Consumers.Fetch + Ack on a
                        3-replica stream, talking to its primary
    Waymaker            waymaker.streams Publish, Fetch + Ack (one seq per Ack) on another
                        3-replica stream, same primary rule; divided by "v1 stream"
    raftlog.v1 topic    Topics.PublishToTopic (keyed), PublishBatch (32) onto the partition
                        streams in turn, Fetch + Ack on each partition's topic-group consumer,
                        all through node 1 (forwarded to each partition's primary)
    Kafka-Pixy          /KafkaPixy/Produce (keyed), ConsumeNAck (acks the previous message);
                        a 3-partition topic through node 1; divided by "v1 topic"
    RocketMQ v2         SendMessage (1 message; 32 for the batch form), ReceiveMessage +
                        AckMessage per queue; a 3-partition topic through node 1; divided by
                        "v1 topic"
    RocketMQ v1         the seed's apache.rocketmq.v1: SendMessage (1 message, any queue:
                        the message id picks the partition, forwarded to its primary),
                        ReceiveMessage of any queue (partition id -1) + one AckMessage per
                        message; a 3-partition topic through node 1; produce unary only (its
                        batch consume gets N more through untimed sends); divided by
                        "v1 topic"
    Numaflow            `raftlog numaflow-source` (a sidecar started here, on a Unix socket,
                        talking to the stream's primary first), driven with pynumaflow's own
                        SourceStub as numa drives it: ReadFn (read n) + AckFn (their offsets)
                        on a third 3-replica stream; consume only (a source has no produce
                        side; its messages go in through raftlog.v1 PublishBatch, untimed);
                        divided by "v1 stream" (the phase: scripts/bench_numaflow.py).
                        Skipped, with the reason, without pynumaflow.

"unary" consume = a receive of 1 message and an ack of it (Kafka-Pixy: one ConsumeNAck);
"batch" consume = a receive of up to 32 (v1 stream 100) and their acks (Waymaker: one Ack per
seq, its protocol has no multi-ack). A front-end without a batch produce form gets its second
N messages through raftlog.v1 PublishBatch, untimed, so every consume phase has N to read.

A table goes to stderr, ONE JSON document to stdout (and to --json FILE).

    scripts/bench-frontends                   2,000 messages per phase
    scripts/bench-frontends --quick           200 messages per phase
    scripts/bench-frontends --messages 500 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_numaflow  # scripts/ is sys.path[0]
import grpc
from bench import BenchCluster

from raftlog.compat import kafkapixy_pb2 as kp
from raftlog.compat import kafkapixy_pb2_grpc as kp_grpc
from raftlog.compat import rocketmq_v1_definition_pb2 as rmq1
from raftlog.compat import rocketmq_v1_service_pb2 as rmq1_svc
from raftlog.compat import rocketmq_v1_service_pb2_grpc as rmq1_grpc
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as rmq_svc
from raftlog.compat import rocketmq_v2_service_pb2_grpc as rmq_grpc
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.compat import waymaker_streams_pb2_grpc as wm_grpc
from raftlog.node.cli import localcluster
from raftlog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)

SCHEMA = "raftlog-bench-frontends/1"
payload_bytes = 128
partitions = 3
stream_batch = 100
topic_batch = 32  # RocketMQ's receive cap, used for every topic batch
quick_messages = 200
call_timeout_s = 10.0
ready_timeout_s = 30.0
empty_poll_ms = 50
warmup_calls = 50  # untimed unary produces through each front-end before its group exists
ack_wait_ms = 120_000
ack_pending_max = 100_000
consume_timeout_s = 120.0
GROUP = "bench"

# Which raftlog.v1 row each front-end row is divided by.
BASELINE = {"Waymaker": "v1 stream", "Numaflow": "v1 stream", "Kafka-Pixy": "v1 topic",
            "RocketMQ v2": "v1 topic", "RocketMQ v1": "v1 topic"}


def _log(text: str) -> None:
    print(f"[bench-frontends] {text}", file=sys.stderr, flush=True)


def summary(latencies_s: list[float], messages: int, elapsed_s: float) -> dict[str, Any]:
    """msgs/s over the whole phase; p50/p99 of the calls (or call pairs) timed."""
    ordered = sorted(latencies_s)
    return {
        "messages": messages, "calls": len(ordered), "elapsed_s": round(elapsed_s, 3),
        "msgs_per_s": round(messages / elapsed_s, 1) if elapsed_s else 0.0,
        "p50_ms": round(1000 * statistics.median(ordered), 3) if ordered else None,
        "p99_ms": round(1000 * ordered[nearest_rank(len(ordered), 0.99)], 3) if ordered else None,
    }


def nearest_rank(count: int, quantile: float) -> int:
    """The index of the `quantile` value in `count` sorted samples (nearest-rank: the
    smallest sample with at least that share of the samples at or below it)."""
    return max(0, math.ceil(quantile * count) - 1)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each front-end's msgs/s over its baseline's, per phase both measured."""
    out: dict[str, dict[str, float]] = {}
    for name, base in BASELINE.items():
        mine, theirs = results.get(name, {}), results.get(base, {})
        out[name] = {phase: round(row["msgs_per_s"] / theirs[phase]["msgs_per_s"], 2)
                     for phase, row in mine.items()
                     if theirs.get(phase, {}).get("msgs_per_s")}
    return out


class Timer:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.messages = 0
        self.started = time.perf_counter()

    def call(self, fn: Callable[[], int]) -> None:
        at = time.perf_counter()
        self.messages += fn()
        self.latencies.append(time.perf_counter() - at)

    def done(self, label: str, phase: str) -> dict[str, Any]:
        row = summary(self.latencies, self.messages, time.perf_counter() - self.started)
        _log(f"{label:<12} {phase:<15} {row['msgs_per_s']:>9,.0f} msgs/s  "
             f"p50 {row['p50_ms']:.3f} ms")
        return row


def retry(fn: Callable[[], Any], what: str) -> Any:
    """Calls fn until it stops answering UNAVAILABLE (a new stream settling)."""
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.ALREADY_EXISTS:  # type: ignore[attr-defined]
                return None
            if (err.code() != grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
                    or time.monotonic() > deadline):
                raise RuntimeError(f"{what}: {err}") from err
            time.sleep(0.1)


class Bench:
    def __init__(self, cluster: BenchCluster, messages: int, workdir: Path) -> None:
        self.n = messages
        self.workdir = workdir
        self.entry = cluster.address
        self.nodes = [f"127.0.0.1:{cluster.base_port + k * localcluster.ports_per_node}"
                      for k in range(cluster.nodes)]
        self.payload = b"p" * payload_bytes
        self.channels: dict[str, grpc.Channel] = {}

    def channel(self, address: str) -> grpc.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return self.channels[address]

    def stubs(self, address: str) -> tuple[Any, Any, Any]:
        ch = self.channel(address)
        return (streams_pb2_grpc.StreamsStub(ch),  # type: ignore[no-untyped-call]
                consumers_pb2_grpc.ConsumersStub(ch),  # type: ignore[no-untyped-call]
                topics_pb2_grpc.TopicsStub(ch))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()

    # ---------------------------------------------------------------- setup

    def make_stream(self, name: str) -> str:
        streams, _, _ = self.stubs(self.entry)
        retry(lambda: streams.CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], replicas=3)),
            timeout=call_timeout_s), f"stream {name}")
        cluster: Any = cluster_pb2_grpc.ClusterStub(self.channel(self.entry))  # type: ignore[no-untyped-call]
        primary = str(cluster.ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=name),
                                           timeout=call_timeout_s).primary_grpc_address)
        streams, _, _ = self.stubs(primary)
        retry(lambda: streams.Publish(streams_pb2.PublishRequest(
            stream=name, subject=f"{name}.warm", payload=b"warm-up"), timeout=call_timeout_s),
            f"stream {name} writable")
        return primary

    def stream_consumer(self, address: str, name: str) -> None:
        """The consumer the benchmark drains, made after the warm-up: it reads what comes
        next."""
        _, consumers, _ = self.stubs(address)
        retry(lambda: consumers.CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=name, config=consumers_pb2.ConsumerConfig(
                name=GROUP, deliver_policy=consumers_pb2.DELIVER_POLICY_NEW,
                ack_wait_ms=ack_wait_ms, max_ack_pending=ack_pending_max)),
            timeout=call_timeout_s), f"consumer on {name}")

    def make_topic(self, name: str) -> None:
        _, _, topics = self.stubs(self.entry)
        retry(lambda: topics.CreateTopic(topics_pb2.CreateTopicRequest(
            name=name, partitions=partitions), timeout=call_timeout_s), f"topic {name}")
        for i in range(partitions):
            retry(lambda i=i: topics.PublishToTopic(topics_pb2.PublishToTopicRequest(
                topic=name, partition=i, payload=b"warm-up"), timeout=call_timeout_s),
                f"partition {i} of {name} writable")

    def topic_group(self, name: str) -> None:
        """The group the benchmark drains, made after the warm-up: it reads what comes next
        on every partition."""
        _, _, topics = self.stubs(self.entry)
        retry(lambda: topics.CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
            topic=name, config=consumers_pb2.ConsumerConfig(
                name=GROUP, deliver_policy=consumers_pb2.DELIVER_POLICY_NEW,
                ack_wait_ms=ack_wait_ms, max_ack_pending=ack_pending_max)),
            timeout=call_timeout_s), f"group on {name}")

    def fill_stream(self, address: str, name: str) -> None:
        """N more messages, untimed, for a front-end without a batch produce."""
        streams, _, _ = self.stubs(address)
        for start in range(0, self.n, stream_batch):
            streams.PublishBatch(streams_pb2.PublishBatchRequest(stream=name, entries=[
                streams_pb2.PublishEntry(subject=f"{name}.m", payload=self.payload)
                for _ in range(min(stream_batch, self.n - start))]), timeout=call_timeout_s)

    def fill_topic(self, name: str) -> None:
        streams, _, _ = self.stubs(self.entry)
        for k, start in enumerate(range(0, self.n, topic_batch)):
            part = f"TOPIC_{name}_p{k % partitions}"
            streams.PublishBatch(streams_pb2.PublishBatchRequest(stream=part, entries=[
                streams_pb2.PublishEntry(subject=part, payload=self.payload)
                for _ in range(min(topic_batch, self.n - start))]), timeout=call_timeout_s)

    # ---------------------------------------------------------------- raftlog.v1 stream

    def v1_stream(self) -> dict[str, Any]:
        name = "benchv1"
        primary = self.make_stream(name)
        streams, consumers, _ = self.stubs(primary)
        out = {}

        def publish() -> int:
            return 1 if streams.Publish(streams_pb2.PublishRequest(
                stream=name, subject=f"{name}.m", payload=self.payload),
                timeout=call_timeout_s).seq else 0
        for _ in range(warmup_calls):
            publish()
        self.stream_consumer(primary, name)
        t = Timer()
        for _ in range(self.n):
            t.call(publish)
        out["produce unary"] = t.done("v1 stream", "produce unary")
        t = Timer()
        for start in range(0, self.n, stream_batch):
            size = min(stream_batch, self.n - start)
            t.call(lambda size=size: int(streams.PublishBatch(streams_pb2.PublishBatchRequest(
                stream=name, entries=[streams_pb2.PublishEntry(subject=f"{name}.m",
                                                               payload=self.payload)
                                      for _ in range(size)]), timeout=call_timeout_s).acked))
        out["produce batch"] = t.done("v1 stream", "produce batch")
        for phase, batch in (("consume unary", 1), ("consume batch", stream_batch)):
            t = Timer()

            def fetch_ack(batch: int = batch) -> int:
                got = consumers.Fetch(consumers_pb2.FetchRequest(
                    stream=name, consumer=GROUP, batch=batch, max_wait_ms=empty_poll_ms),
                    timeout=call_timeout_s).messages
                if got:
                    consumers.Ack(consumers_pb2.AckRequest(
                        stream=name, consumer=GROUP, seqs=[m.seq for m in got]),
                        timeout=call_timeout_s)
                return len(got)
            self.drain(t, fetch_ack)
            out[phase] = t.done("v1 stream", phase)
        return out

    def drain(self, t: Timer, step: Callable[[], int]) -> None:
        deadline = time.monotonic() + consume_timeout_s
        while t.messages < self.n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {t.messages} of {self.n} in {consume_timeout_s} s")
            t.call(step)

    # ---------------------------------------------------------------- Waymaker

    def waymaker(self) -> dict[str, Any]:
        name = "benchwm"
        primary = self.make_stream(name)
        stub: Any = wm_grpc.WaymakerStreamsServiceStub(self.channel(primary))  # type: ignore[no-untyped-call]
        out = {}

        def publish() -> int:
            answer = stub.Publish(wm.PublishRequest(stream=name, subject=f"{name}.m",
                                                    payload=self.payload),
                                  timeout=call_timeout_s)
            if not answer.success:
                raise RuntimeError(f"waymaker publish: {answer.result_code} {answer.message}")
            return 1
        for _ in range(warmup_calls):
            publish()
        self.stream_consumer(primary, name)
        t = Timer()
        for _ in range(self.n):
            t.call(publish)
        out["produce unary"] = t.done("Waymaker", "produce unary")
        self.fill_stream(primary, name)
        for phase, batch in (("consume unary", 1), ("consume batch", stream_batch)):
            t = Timer()

            def fetch_ack(batch: int = batch) -> int:
                answer = stub.Fetch(wm.FetchRequest(stream=name, consumer=GROUP,
                                                    batch_size=batch), timeout=call_timeout_s)
                if not answer.success:
                    raise RuntimeError(f"waymaker fetch: {answer.result_code} {answer.message}")
                for m in answer.messages:
                    acked = stub.Ack(wm.AckRequest(stream=name, consumer=GROUP, seq=m.seq),
                                     timeout=call_timeout_s)
                    if not acked.success:
                        raise RuntimeError(f"waymaker ack: {acked.result_code}")
                return len(answer.messages)
            self.drain(t, fetch_ack)
            out[phase] = t.done("Waymaker", phase)
        return out

    # ---------------------------------------------------------------- raftlog.v1 topic

    def v1_topic(self) -> dict[str, Any]:
        name = "benchv1t"
        self.make_topic(name)
        _, consumers, topics = self.stubs(self.entry)
        out = {}

        def publish(n: int) -> int:
            return 1 if topics.PublishToTopic(topics_pb2.PublishToTopicRequest(
                topic=name, key=f"key-{n}".encode(), payload=self.payload),
                timeout=call_timeout_s).seq else 0
        for n in range(warmup_calls):
            publish(n)
        self.topic_group(name)
        t = Timer()
        for n in range(self.n):
            t.call(lambda n=n: publish(n))
        out["produce unary"] = t.done("v1 topic", "produce unary")
        streams, _, _ = self.stubs(self.entry)
        t = Timer()
        for k, start in enumerate(range(0, self.n, topic_batch)):
            size, part = min(topic_batch, self.n - start), f"TOPIC_{name}_p{k % partitions}"
            t.call(lambda size=size, part=part: int(streams.PublishBatch(
                streams_pb2.PublishBatchRequest(stream=part, entries=[
                    streams_pb2.PublishEntry(subject=part, payload=self.payload)
                    for _ in range(size)]), timeout=call_timeout_s).acked))
        out["produce batch"] = t.done("v1 topic", "produce batch")
        for phase, batch in (("consume unary", 1), ("consume batch", topic_batch)):
            t = Timer()
            queue = QueueTurn()

            def fetch_ack(batch: int = batch, t: Timer = t, queue: QueueTurn = queue) -> int:
                part = f"TOPIC_{name}_p{queue.index}"
                got = consumers.Fetch(consumers_pb2.FetchRequest(
                    stream=part, consumer=GROUP, batch=min(batch, self.n - t.messages),
                    max_wait_ms=empty_poll_ms), timeout=call_timeout_s).messages
                if got:
                    consumers.Ack(consumers_pb2.AckRequest(
                        stream=part, consumer=GROUP, seqs=[m.seq for m in got]),
                        timeout=call_timeout_s)
                else:
                    queue.next()
                return len(got)
            self.drain(t, fetch_ack)
            out[phase] = t.done("v1 topic", phase)
        return out

    # ---------------------------------------------------------------- Kafka-Pixy

    def kafkapixy(self) -> dict[str, Any]:
        name = "benchkp"
        self.make_topic(name)
        stub: Any = kp_grpc.KafkaPixyStub(self.channel(self.entry))  # type: ignore[no-untyped-call]
        out = {}

        def produce(n: int) -> int:
            return 1 if stub.Produce(kp.ProdRq(
                topic=name, key_value=f"key-{n}".encode(), message=self.payload),
                timeout=call_timeout_s).offset >= 0 else 0
        for n in range(warmup_calls):
            produce(n)
        self.topic_group(name)
        t = Timer()
        for n in range(self.n):
            t.call(lambda n=n: produce(n))
        out["produce unary"] = t.done("Kafka-Pixy", "produce unary")
        t = Timer()
        last: list[Any] = []

        def consume() -> int:
            request = kp.ConsNAckRq(topic=name, group=GROUP, no_ack=not last)
            if last:
                request.ack_partition, request.ack_offset = last[0].partition, last[0].offset
            answer = stub.ConsumeNAck(request, timeout=call_timeout_s)
            last[:] = [answer]
            return 1
        self.drain(t, consume)
        stub.Ack(kp.AckRq(topic=name, group=GROUP, partition=last[0].partition,
                          offset=last[0].offset), timeout=call_timeout_s)
        out["consume unary"] = t.done("Kafka-Pixy", "consume unary")
        return out

    # ---------------------------------------------------------------- RocketMQ v2

    def rocketmq(self) -> dict[str, Any]:
        name = "benchrmq"
        self.make_topic(name)
        stub: Any = rmq_grpc.MessagingServiceStub(self.channel(self.entry))  # type: ignore[no-untyped-call]
        topic = rmq.Resource(name=name)
        route = stub.QueryRoute(rmq_svc.QueryRouteRequest(topic=topic), timeout=call_timeout_s)
        queues = list(route.message_queues)
        out = {}
        counter = iter(range(10**9))

        def send(size: int) -> int:
            answer = stub.SendMessage(rmq_svc.SendMessageRequest(messages=[rmq.Message(
                topic=topic, body=self.payload, system_properties=rmq.SystemProperties(
                    message_id=f"bench-{next(counter)}", message_type=rmq.NORMAL))
                for _ in range(size)]), timeout=call_timeout_s)
            if answer.status.code != rmq.OK:
                raise RuntimeError(f"rocketmq send: {answer.status}")
            return len(answer.entries)
        for _ in range(warmup_calls):
            send(1)
        self.topic_group(name)
        for label, size in (("produce unary", 1), ("produce batch", topic_batch)):
            t = Timer()
            for start in range(0, self.n, size):
                t.call(lambda size=size, start=start: send(min(size, self.n - start)))
            out[label] = t.done("RocketMQ v2", label)
        group = rmq.Resource(name=GROUP)
        for phase, batch in (("consume unary", 1), ("consume batch", topic_batch)):
            t = Timer()
            queue = QueueTurn()

            def receive_ack(batch: int = batch, t: Timer = t, queue: QueueTurn = queue) -> int:
                answers = stub.ReceiveMessage(rmq_svc.ReceiveMessageRequest(
                    group=group, message_queue=queues[queue.index],
                    filter_expression=rmq.FilterExpression(type=rmq.TAG, expression="*"),
                    batch_size=min(batch, self.n - t.messages),
                    invisible_duration={"seconds": ack_wait_ms // 1000},
                    long_polling_timeout={"nanos": empty_poll_ms * 1_000_000}),
                    timeout=call_timeout_s)
                got = [a.message for a in answers if a.WhichOneof("content") == "message"]
                if not got:
                    queue.next()
                    return 0
                acked = stub.AckMessage(rmq_svc.AckMessageRequest(
                    group=group, topic=topic, entries=[rmq_svc.AckMessageEntry(
                        message_id=m.system_properties.message_id,
                        receipt_handle=m.system_properties.receipt_handle) for m in got]),
                    timeout=call_timeout_s)
                if acked.status.code != rmq.OK:
                    raise RuntimeError(f"rocketmq ack: {acked.status}")
                return len(got)
            self.drain(t, receive_ack)
            out[phase] = t.done("RocketMQ v2", phase)
        return out

    # ---------------------------------------------------------------- RocketMQ v1

    def rocketmq_v1(self) -> dict[str, Any]:
        """The seed's v1 protocol: one message per SendMessage and per AckMessage (as v1 has
        it), receives of any queue (partition id -1) in batches."""
        name = "benchrmq1"
        self.make_topic(name)
        stub: Any = rmq1_grpc.MessagingServiceStub(self.channel(self.entry))  # type: ignore[no-untyped-call]
        topic = rmq1.Resource(name=name)
        counter = iter(range(10**9))
        out = {}

        def send() -> int:
            answer = stub.SendMessage(rmq1_svc.SendMessageRequest(message=rmq1.Message(
                topic=topic, body=self.payload, system_attribute=rmq1.SystemAttribute(
                    message_id=f"bench1-{next(counter)}", message_type=rmq1.NORMAL)),
                partition=rmq1.Partition(id=-1)), timeout=call_timeout_s)
            if answer.common.status.code != 0:
                raise RuntimeError(f"rocketmq v1 send: {answer.common.status}")
            return 1
        for _ in range(warmup_calls):
            send()
        self.topic_group(name)
        t = Timer()
        for _ in range(self.n):
            t.call(send)
        out["produce unary"] = t.done("RocketMQ v1", "produce unary")
        for _ in range(self.n):  # (untimed) v1 sends one message a call: the batch phase's
            send()
        group = rmq1.Resource(name=GROUP)
        for phase, batch in (("consume unary", 1), ("consume batch", topic_batch)):
            t = Timer()

            def receive_ack(batch: int = batch, t: Timer = t) -> int:
                answer = stub.ReceiveMessage(rmq1_svc.ReceiveMessageRequest(
                    group=group, client_id="bench", partition=rmq1.Partition(
                        topic=topic, id=-1),
                    filter_expression=rmq1.FilterExpression(type=rmq1.TAG, expression="*"),
                    batch_size=min(batch, self.n - t.messages),
                    invisible_duration={"seconds": ack_wait_ms // 1000},
                    await_time={"nanos": empty_poll_ms * 1_000_000}), timeout=call_timeout_s)
                if answer.common.status.code != 0:
                    raise RuntimeError(f"rocketmq v1 receive: {answer.common.status}")
                for m in answer.messages:
                    acked = stub.AckMessage(rmq1_svc.AckMessageRequest(
                        group=group, topic=topic, client_id="bench",
                        receipt_handle=m.system_attribute.receipt_handle,
                        message_id=m.system_attribute.message_id), timeout=call_timeout_s)
                    if acked.common.status.code != 0:
                        raise RuntimeError(f"rocketmq v1 ack: {acked.common.status}")
                return len(answer.messages)
            self.drain(t, receive_ack)
            out[phase] = t.done("RocketMQ v1", phase)
        return out

    # ---------------------------------------------------------------- Numaflow

    def numaflow(self) -> dict[str, Any]:
        """Raises ImportError without pynumaflow."""
        name = "benchnf"
        primary = self.make_stream(name)
        self.stream_consumer(primary, name)
        self.fill_stream(primary, name)
        self.fill_stream(primary, name)
        return bench_numaflow.run(
            bench_numaflow.Setup(stream=name, consumer=GROUP, messages=self.n,
                                 batch=stream_batch, workdir=self.workdir,
                                 servers=[primary] + [a for a in self.nodes if a != primary],
                                 call_timeout_s=call_timeout_s,
                                 consume_timeout_s=consume_timeout_s),
            summarize=summary, log=_log)


class QueueTurn:
    """The partition being drained; moves on when one answers empty."""

    def __init__(self) -> None:
        self.index = 0

    def next(self) -> None:
        self.index = (self.index + 1) % partitions


# ---------------------------------------------------------------- report

def table(document: dict[str, Any]) -> str:
    lines = [f"{'front-end':<12} {'phase':<14} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'ratio':>6}  vs"]
    for name, phases in document["results"].items():
        for phase, row in phases.items():
            ratio = document["ratios"].get(name, {}).get(phase)
            lines.append(f"{name:<12} {phase:<14} {row['msgs_per_s']:>9,.0f} "
                         f"{row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
                         f"{'-' if ratio is None else f'{ratio:.2f}':>6}  "
                         f"{BASELINE.get(name, '') if ratio is not None else ''}")
    for name, reason in document["skipped"].items():
        lines.append(f"{name}: skipped ({reason})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-frontends", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per phase")
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_messages} messages per phase")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    messages = quick_messages if args.quick else args.messages
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-frontends-") as workdir:
        cluster = BenchCluster(Path(workdir), nodes=3)
        _log(f"starting a 3-node raftlog cluster from {cluster.address}")
        cluster.start()
        bench = Bench(cluster, messages, Path(workdir))
        try:
            results["v1 stream"] = bench.v1_stream()
            results["Waymaker"] = bench.waymaker()
            try:
                results["Numaflow"] = bench.numaflow()
            except ImportError as err:
                skipped["Numaflow"] = f"pynumaflow is not installed ({err}); see docs/numaflow.md"
                _log(f"Numaflow skipped: {skipped['Numaflow']}")
            results["v1 topic"] = bench.v1_topic()
            results["Kafka-Pixy"] = bench.kafkapixy()
            results["RocketMQ v2"] = bench.rocketmq()
            results["RocketMQ v1"] = bench.rocketmq_v1()
        finally:
            bench.close()
            cluster.stop()
            _log("raftlog cluster stopped")
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {"messages": messages, "payload_bytes": payload_bytes, "partitions": partitions,
                 "replicas": 3, "stream_batch": stream_batch, "topic_batch": topic_batch,
                 "clients": 1, "in_flight": 1, "python": platform.python_version(),
                 "grpcio": grpc.__version__, "cpus": os.cpu_count(),
                 "load_avg": [round(x, 2) for x in os.getloadavg()],
                 "duration_s": round(time.monotonic() - started, 1)},
        "baselines": BASELINE,
        "results": results,
        "ratios": ratios(results),
        "skipped": skipped,
    }
    print(table(document), file=sys.stderr)
    text = json.dumps(document, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
