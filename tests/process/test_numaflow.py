"""Issue 15 item 4 end to end: `raftlog numaflow-source` on a 3-node cluster, driven with
numaproj's own generated client (pynumaflow's `SourceStub`) exactly as numa drives it, and the
same sequence run against pynumaflow's own reference server (tests/process/numaflow_reference.py)
with the shapes of the answers compared.

- The server-info file appears once the socket serves, holds the JSON numa parses and the
  terminator it waits for, and is removed when the sidecar stops.
- Handshake, reads of up to N records then exactly one EOT (also when nothing is there, within
  the timeout), acks with one offset per request and with a whole batch, pending, partitions
  and offset.partition_id agreeing, is-ready: the same shapes as the reference server.
- Bad input: a read or ack stream without the handshake, malformed offsets, an offset of another
  stream get an error status and the sidecar keeps serving; a well-formed offset that was never
  delivered is acked as a no-op (numa cannot act on a refusal).
- At-least-once: an unacked read comes back after the ack wait and after a nack; with the
  stream's primary killed (-9) during reads, every record is read, none acknowledged comes back
  and the unacknowledged ones do.
- `--topic`: one sidecar reads every partition of a 3-partition topic of keyed records exactly
  once, round-robin, each record's partition_id its topic partition (PartitionsFn [0, 1, 2],
  total 3), pending drops to 0; with `--replicas 2` two sidecars split the partitions ([0, 2]
  and [1]) and together read everything once; conflicting options and an unknown topic end the
  command with one line on stderr.

The test process imports only pynumaflow's `source.v1` stubs (never raftlog.compat's: both
define the same proto symbols in the default descriptor pool). Processes are stopped by pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2

from raftlog.base import children
from raftlog.base.topics import parse_partition_stream, partition_stream
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    streams_pb2,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)

INSTALL = ("pynumaflow is not installed: .venv/bin/pip install --no-deps pynumaflow==0.14.0 "
           "aiorun uvloop psutil (docs/numaflow.md)")
pb: Any = pytest.importorskip("pynumaflow.proto.sourcer.source_pb2", reason=INSTALL)
pb_grpc: Any = pytest.importorskip("pynumaflow.proto.sourcer.source_pb2_grpc", reason=INSTALL)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("numaflow_reference.py")
END = "U+005C__END__"
call_timeout_s = 10.0
start_timeout_s = 20.0  # sidecar or reference process -> server-info file written
stop_timeout_s = 10.0
failover_timeout_s = 40.0  # kill -9 of the primary -> every record read again
ack_wait_ms = 2_000
read_timeout_ms = 1_000  # numa's default readTimeout
slack_s = 1.5  # an empty read's EOT may come this much after its timeout
records = 20


# ---------------------------------------------------------------------------------------------
# Processes.


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("numaflow") / "cluster", nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="nf", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_stream(cluster: LocalCluster, stream: str, *, count: int,
                consumer: str = "numa") -> list[bytes]:
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=stream, subjects=[f"{stream}.>"], replicas=3)), timeout=call_timeout_s)
    payloads = publish(cluster, stream, [b"%s-%d" % (stream.encode(), k) for k in range(count)])
    cluster.consumers(2).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream=stream, config=consumers_pb2.ConsumerConfig(name=consumer,
                                                           ack_wait_ms=ack_wait_ms)),
        timeout=call_timeout_s)
    return payloads


def publish(cluster: LocalCluster, stream: str, payloads: list[bytes]) -> list[bytes]:
    if payloads:
        entries = [streams_pb2.PublishEntry(subject=f"{stream}.k", payload=p) for p in payloads]
        cluster.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(
            stream=stream, entries=entries), timeout=call_timeout_s)
    return payloads


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    socket: Path
    info: Path
    log: Path
    target: str = field(init=False)

    def __post_init__(self) -> None:
        self.target = f"unix://{self.socket}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextmanager
def started(argv: list[str], *, socket: Path, info: Path,
            env: dict[str, str] | None = None) -> Iterator[Served]:
    log = socket.with_suffix(".log")
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=None if env is None else {**os.environ, **env})
    served = Served(process, socket, info, log)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not (info.exists() and info.read_text().endswith(END)):
            assert process.poll() is None, f"exited {process.returncode}:\n{served.output()}"
            assert time.monotonic() < deadline, f"no server-info file:\n{served.output()}"
            time.sleep(0.05)
        yield served
    finally:
        children.end(process, timeout_s=stop_timeout_s)


def sidecar(cluster: LocalCluster, sockets: Path, stream: str, *extra: str,
            consumer: str = "numa", server_info: bool = True, first: int = 1) -> Any:
    """The sidecar process, talking to node `first` until that fails."""
    socket = sockets / f"{stream}.sock"
    info = sockets / f"{stream}-server-info"
    servers = ",".join(cluster.address(i) for i in sorted((1, 2, 3), key=lambda i: i != first))
    argv = [sys.executable, "-m", "raftlog.node.cli", "numaflow-source", "--stream", stream,
            "--consumer", consumer, "--socket", str(socket), "--server", servers, *extra]
    if server_info:
        argv += ["--server-info", str(info)]
    return started(argv, socket=socket, info=info)


def reference(sockets: Path, *, count: int) -> Any:
    socket, info = sockets / "ref.sock", sockets / "ref-server-info"
    env_python = [sys.executable, str(REFERENCE), str(socket), str(info), str(count)]
    return started(env_python, socket=socket, info=info)


# ---------------------------------------------------------------------------------------------
# numa's side of the protocol (numaflow-core user_defined.rs), with pynumaflow's stubs.


@asynccontextmanager
async def source(target: str) -> AsyncIterator[Any]:
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        yield pb_grpc.SourceStub(channel)


class Reader:
    """One ReadFn stream: handshake, then read(n, timeout) -> the results before the EOT."""

    def __init__(self, stub: Any) -> None:
        self.call = stub.ReadFn()
        self.handshake: Any = None

    async def open(self) -> Reader:
        await self.call.write(pb.ReadRequest(handshake=pb.Handshake(sot=True)))
        self.handshake = await self.call.read()
        return self

    async def read(self, num_records: int, *, timeout_ms: int = read_timeout_ms) -> list[Any]:
        await self.call.write(pb.ReadRequest(request=pb.ReadRequest.Request(
            num_records=num_records, timeout_in_ms=timeout_ms)))
        results = []
        while True:
            answer = await asyncio.wait_for(self.call.read(), timeout_ms / 1000 + call_timeout_s)
            assert answer is not grpc.aio.EOF, "the read stream ended before its EOT"
            if answer.status.eot:
                assert not answer.HasField("result"), answer
                return results
            assert answer.HasField("result") and not answer.status.eot, answer
            results.append(answer.result)

    async def close(self) -> None:
        await self.call.done_writing()


class Acker:
    """One AckFn stream: handshake, then ack(offsets) -> the one response per request."""

    def __init__(self, stub: Any) -> None:
        self.call = stub.AckFn()
        self.handshake: Any = None

    async def open(self) -> Acker:
        await self.call.write(pb.AckRequest(handshake=pb.Handshake(sot=True)))
        self.handshake = await asyncio.wait_for(self.call.read(), call_timeout_s)
        return self

    async def ack(self, offsets: list[Any]) -> Any:
        await self.call.write(pb.AckRequest(request=pb.AckRequest.Request(offsets=offsets)))
        return await asyncio.wait_for(self.call.read(), 2 * call_timeout_s)

    async def close(self) -> None:
        await self.call.done_writing()


async def numa_sequence(target: str, *, count: int) -> dict[str, Any]:
    """What numa does from start-up to a drained source, summarised by shape."""
    shape: dict[str, Any] = {}
    async with source(target) as stub:
        shape["ready"] = (await stub.IsReady(empty_pb2.Empty(), timeout=call_timeout_s)).ready
        partitions = await stub.PartitionsFn(empty_pb2.Empty(), timeout=call_timeout_s)
        shape["partitions"] = list(partitions.result.partitions)
        pending = [(await stub.PendingFn(empty_pb2.Empty())).result.count]
        reader, acker = await Reader(stub).open(), await Acker(stub).open()
        shape["read_handshake"] = (reader.handshake.handshake.sot, reader.handshake.status.eot,
                                   reader.handshake.HasField("result"))
        shape["ack_handshake"] = (acker.handshake.handshake.sot,
                                  acker.handshake.result.HasField("success"))
        first = await reader.read(3)
        pending.append((await stub.PendingFn(empty_pb2.Empty())).result.count)
        answers = [await acker.ack([first[0].offset]),  # the seed's shape: one offset
                   await acker.ack([r.offset for r in first[1:]])]  # numa's: the whole batch
        rest = await reader.read(count + 10)
        answers.append(await acker.ack([r.offset for r in rest]))
        started_s = time.monotonic()
        empty = await reader.read(5, timeout_ms=300)
        shape["empty_read_s"] = time.monotonic() - started_s
        pending.append((await stub.PendingFn(empty_pb2.Empty())).result.count)
        await reader.close()
        await acker.close()
    results = first + rest
    shape["reads"] = [len(first), len(rest), len(empty)]
    shape["acks"] = [(a.result.HasField("success"), a.HasField("handshake")) for a in answers]
    shape["pending_drop"] = [pending[0] - p for p in pending]
    shape["results_valid"] = all(
        r.offset.offset and r.HasField("event_time") and r.event_time.seconds > 0
        and r.offset.partition_id in shape["partitions"] for r in results)
    shape["payloads"] = [r.payload for r in results]
    shape["offsets_distinct"] = len({r.offset.offset for r in results}) == len(results)
    return shape


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# ---------------------------------------------------------------------------------------------
# Tests.


def test_server_info_file_is_written_once_serving_and_removed_on_exit(
        cluster: LocalCluster, sockets: Path) -> None:
    make_stream(cluster, "info", count=0)
    with sidecar(cluster, sockets, "info") as served:
        text = served.info.read_text()
        assert text.endswith(END) and text.count(END) == 1
        fields = json.loads(text[: -len(END)])
        assert fields["protocol"] == "uds" and fields["language"] == "python"
        assert fields["version"] == "0.11.0"  # numa calls NackFn only for python >= 0.11
        assert fields["minimum_numaflow_version"] == "1.4.0-z"

        async def ready() -> bool:  # the socket serves as soon as the file is there
            async with source(served.target) as stub:
                answer = await stub.IsReady(empty_pb2.Empty(), timeout=call_timeout_s)
                return bool(answer.ready)

        assert run(ready())
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(stop_timeout_s) == 0, served.output()
    assert not served.info.exists() and not served.socket.exists()


def test_numa_sequence_matches_the_reference_server(cluster: LocalCluster,
                                                    sockets: Path) -> None:
    published = make_stream(cluster, "seq", count=records)
    with sidecar(cluster, sockets, "seq") as served:
        ours = run(numa_sequence(served.target, count=records))
        info = cluster.consumers(3).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
            stream="seq", consumer="numa"), timeout=call_timeout_s)
    with reference(sockets, count=records) as served:
        theirs = run(numa_sequence(served.target, count=records))

    assert ours["payloads"] == published  # in order, each once
    assert theirs["payloads"] == [b"m%d" % i for i in range(records)]
    assert (info.state.ack_floor, info.state.num_ack_pending) == (records, 0)  # acks committed
    for shape in (ours, theirs):
        assert shape["empty_read_s"] < 0.3 + slack_s, shape["empty_read_s"]
        del shape["payloads"], shape["empty_read_s"]
    expected = {
        "ready": True, "partitions": [0],
        "read_handshake": (True, False, False), "ack_handshake": (True, True),
        "reads": [3, records - 3, 0], "acks": [(True, False)] * 3,
        "pending_drop": [0, 3, records], "results_valid": True, "offsets_distinct": True,
    }
    assert ours == expected
    assert theirs == expected


def test_bad_input_gets_an_error_status_and_the_sidecar_keeps_serving(
        cluster: LocalCluster, sockets: Path) -> None:
    make_stream(cluster, "bad", count=2)

    async def drive(target: str) -> dict[str, str]:
        seen: dict[str, str] = {}
        async with source(target) as stub:
            for name, call, first in (
                    ("read_without_handshake", stub.ReadFn(), pb.ReadRequest(
                        request=pb.ReadRequest.Request(num_records=1, timeout_in_ms=100))),
                    ("ack_without_handshake", stub.AckFn(), pb.AckRequest(
                        request=pb.AckRequest.Request(offsets=[pb.Offset(offset=b"x")])))):
                await call.write(first)
                try:
                    await asyncio.wait_for(call.read(), call_timeout_s)
                    seen[name] = "answered"
                except grpc.aio.AioRpcError as err:
                    seen[name] = f"{err.code().name}: {err.details()}"
            for name, offset in (("garbage", b"not-ours"), ("bad_seq", b"raftlog:bad:x"),
                                 ("other_stream", b"raftlog:seq:1"),
                                 ("never_delivered", b"raftlog:bad:2")):
                acker = await Acker(stub).open()
                try:
                    answer = await acker.ack([pb.Offset(offset=offset)])
                    seen[name] = f"success={answer.result.HasField('success')}"
                except grpc.aio.AioRpcError as err:
                    seen[name] = f"{err.code().name}: {err.details()}"
            seen["nack_nothing"] = ""
            try:
                await stub.NackFn(pb.NackRequest(), timeout=call_timeout_s)
            except grpc.aio.AioRpcError as err:
                seen["nack_nothing"] = err.code().name
            reader = await Reader(stub).open()
            seen["still_reads"] = str(len(await reader.read(5)))
            await reader.close()
            await asyncio.to_thread(cluster.consumers(1).DeleteConsumer,
                                    consumers_pb2.DeleteConsumerRequest(
                                        stream="bad", consumer="numa"), timeout=call_timeout_s)
            reader = await Reader(stub).open()
            try:
                await reader.read(1)
                seen["consumer_deleted"] = "answered"
            except grpc.aio.AioRpcError as err:
                seen["consumer_deleted"] = f"{err.code().name}: {err.details()}"
            seen["still_ready"] = str((await stub.IsReady(empty_pb2.Empty())).ready)
        return seen

    with sidecar(cluster, sockets, "bad") as served:
        seen = run(drive(served.target))
        assert served.process.poll() is None
    assert seen["read_without_handshake"].startswith("FAILED_PRECONDITION: ReadFn: the first")
    assert seen["ack_without_handshake"].startswith("FAILED_PRECONDITION: AckFn: the first")
    assert seen["garbage"].startswith("INVALID_ARGUMENT: AckFn: offset b'not-ours' was not")
    assert seen["bad_seq"].startswith("INVALID_ARGUMENT: AckFn: offset b'raftlog:bad:x' is")
    assert seen["other_stream"] == ("INVALID_ARGUMENT: AckFn: offset of stream 'seq', but "
                                    "this source reads 'bad'")
    assert seen["never_delivered"] == "success=True"
    assert seen["nack_nothing"] == "INVALID_ARGUMENT"
    assert seen["still_reads"] == "2"
    assert seen["consumer_deleted"].startswith(
        "NOT_FOUND: Fetch of bad/numa: CONSUMER_NOT_FOUND: "), seen["consumer_deleted"]
    assert seen["still_ready"] == "True"


async def nack_as_numa_does(channel_target: str, offsets: list[Any]) -> bytes:
    """numa's NackFn: one NackRequest.Request per offset (a repeated field 1). pynumaflow's
    stubs declare the field singular, so the request is encoded by concatenating one-Request
    messages (what a repeated field is on the wire) and sent through a raw channel method."""
    body = b"".join(pb.NackRequest(request=pb.NackRequest.Request(offsets=[o]))
                    .SerializeToString() for o in offsets)
    async with grpc.aio.insecure_channel(channel_target) as channel:
        nack = channel.unary_unary("/source.v1.Source/NackFn")
        answer: bytes = await nack(body, timeout=call_timeout_s)
    return answer


def test_unacked_reads_come_back_after_the_ack_wait_and_after_a_nack(
        cluster: LocalCluster, sockets: Path) -> None:
    make_stream(cluster, "redo", count=4)

    async def drive(target: str) -> list[list[bytes]]:
        async with source(target) as stub:
            reader = await Reader(stub).open()
            first = await reader.read(1)  # never acked
            pair = await reader.read(2)
            await nack_as_numa_does(target, [r.offset for r in pair])
            after_nack = await reader.read(2)
            last = await reader.read(1)
            answer = await stub.NackFn(pb.NackRequest(request=pb.NackRequest.Request(
                offsets=[last[0].offset])), timeout=call_timeout_s)  # the SDK's shape
            assert answer.result.HasField("success")
            after_sdk_nack = await reader.read(1)
            waited = await reader.read(1, timeout_ms=ack_wait_ms + 1_500)
            acker = await Acker(stub).open()
            await acker.ack([r.offset for r in after_nack + after_sdk_nack + waited])
            drained = await reader.read(5, timeout_ms=300)
            await reader.close()
            await acker.close()
        return [[r.offset.offset for r in batch]
                for batch in (first, pair, after_nack, after_sdk_nack, waited, drained)]

    with sidecar(cluster, sockets, "redo") as served:
        first, pair, after_nack, after_sdk_nack, waited, drained = run(drive(served.target))
    assert first == [b"raftlog:redo:1"] and pair == [b"raftlog:redo:2", b"raftlog:redo:3"]
    assert after_nack == pair  # both nacked records, at once (--nack-delay 0)
    assert after_sdk_nack == [b"raftlog:redo:4"]
    assert waited == first  # the unacked record, after the ack wait
    assert drained == []


# ---------------------------------------------------------------------------------------------
# --topic: every partition of a topic (or a replica's share of them) as one source.

TOPIC = "nf.topic"
FAIL_TOPIC = "nf.fail"
topic_partitions = 3
topic_records = 30
topic_ack_wait = "30s"  # longer than any test: nothing here is redelivered by the ack wait


def topics_api(cluster: LocalCluster, i: int) -> Any:
    return topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def publish_to_topic(cluster: LocalCluster, topic: str, key: str, payload: bytes) -> int:
    """Publishes one keyed record; its partition. A partition created a moment ago answers
    UNAVAILABLE until its primary has heard from its replicas: retried, bounded."""
    partitions: list[int] = []

    def published() -> bool:
        try:
            answer = topics_api(cluster, 1).PublishToTopic(topics_pb2.PublishToTopicRequest(
                topic=topic, key=key.encode(), payload=payload), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        partitions.append(answer.partition)
        return True

    wait_until(published, failover_timeout_s, interval_s=0.1, what=f"{topic} writable")
    return partitions[0]


def make_topic(cluster: LocalCluster, topic: str) -> dict[bytes, int]:
    """A 3-partition topic of keyed records: payload -> the partition it was stored in."""
    topics_api(cluster, 1).CreateTopic(topics_pb2.CreateTopicRequest(
        name=topic, partitions=topic_partitions), timeout=call_timeout_s)
    where = {b"r%d" % k: publish_to_topic(cluster, topic, f"key-{k % 10}", b"r%d" % k)
             for k in range(topic_records)}
    per_partition = [sorted(where.values()).count(p) for p in range(topic_partitions)]
    assert min(per_partition) >= 2, per_partition  # the round-robin check below needs it
    return where


@pytest.fixture(scope="module")
def keyed_topic(cluster: LocalCluster) -> dict[bytes, int]:
    return make_topic(cluster, TOPIC)


def topic_sidecar(cluster: LocalCluster, sockets: Path, name: str, *extra: str,
                  consumer: str, env: dict[str, str] | None = None, topic: str = TOPIC,
                  ack_wait: str = topic_ack_wait, first: int = 1) -> Any:
    socket, info = sockets / f"{name}.sock", sockets / f"{name}-server-info"
    servers = ",".join(cluster.address(i) for i in sorted((1, 2, 3), key=lambda i: i != first))
    argv = [sys.executable, "-m", "raftlog.node.cli", "numaflow-source", "--topic", topic,
            "--consumer", consumer, "--create-consumer", "--ack-wait", ack_wait,
            "--socket", str(socket), "--server-info", str(info), "--server", servers, *extra]
    return started(argv, socket=socket, info=info, env=env)


async def drain(target: str, *, expect: int, batch: int) -> dict[str, Any]:
    """numa's loop until `expect` records were read: read a batch, ack it; then one empty
    read. What it saw, summarised."""
    seen: dict[str, Any] = {}
    async with source(target) as stub:
        partitions = (await stub.PartitionsFn(empty_pb2.Empty(), timeout=call_timeout_s)).result
        seen["partitions"] = list(partitions.partitions)
        seen["total"] = (partitions.total_partitions
                         if partitions.HasField("total_partitions") else None)
        seen["pending_before"] = (await stub.PendingFn(empty_pb2.Empty())).result.count
        reader, acker = await Reader(stub).open(), await Acker(stub).open()
        reads: list[list[Any]] = []
        deadline = time.monotonic() + failover_timeout_s
        while sum(map(len, reads)) < expect and time.monotonic() < deadline:
            reads.append(await reader.read(batch))
            if reads[-1]:
                answer = await acker.ack([r.offset for r in reads[-1]])
                assert answer.result.HasField("success"), answer
        seen["empty"] = await reader.read(5, timeout_ms=300)
        seen["pending_after"] = (await stub.PendingFn(empty_pb2.Empty())).result.count
        await reader.close()
        await acker.close()
    seen["reads"] = [r for r in reads if r]
    seen["results"] = [r for batch_ in reads for r in batch_]
    return seen


def partition_of_offset(result: Any, *, topic: str = TOPIC) -> int:
    """The topic partition named by an offset `raftlog:<partition stream>:<seq>`."""
    stream = result.offset.offset.decode().split(":")[1]
    parsed = parse_partition_stream(stream)
    assert parsed is not None and parsed[0] == topic, stream
    return parsed[1]


def test_topic_mode_reads_every_partition_once_round_robin(
        cluster: LocalCluster, sockets: Path, keyed_topic: dict[bytes, int]) -> None:
    with topic_sidecar(cluster, sockets, "topic", consumer="numa") as served:
        seen = run(drain(served.target, expect=topic_records, batch=6))
        assert served.process.poll() is None, served.output()
    offsets = topics_api(cluster, 2).GetTopicOffsets(topics_pb2.GetTopicOffsetsRequest(
        topic=TOPIC, group="numa"), timeout=call_timeout_s)

    results = seen["results"]
    assert (seen["partitions"], seen["total"]) == ([0, 1, 2], topic_partitions)
    assert (seen["pending_before"], seen["pending_after"]) == (topic_records, 0)
    assert sorted(r.payload for r in results) == sorted(keyed_topic)  # each record once
    for r in results:
        assert r.offset.partition_id == partition_of_offset(r) == keyed_topic[r.payload]
        assert r.HasField("event_time") and r.event_time.seconds > 0
    # Round-robin: the first read of 6 takes 2 from each partition; per partition, in order.
    assert sorted(r.offset.partition_id for r in seen["reads"][0]) == [0, 0, 1, 1, 2, 2]
    for p in range(topic_partitions):
        mine = [int(r.payload[1:]) for r in results if r.offset.partition_id == p]
        assert mine == sorted(mine), (p, mine)
    assert seen["empty"] == []
    assert [(o.ack_floor, o.num_ack_pending) for o in offsets.partitions] == [
        (o.last_seq, 0) for o in offsets.partitions]  # every ack committed


def test_topic_replicas_split_the_partitions_and_read_everything_once(
        cluster: LocalCluster, sockets: Path, keyed_topic: dict[bytes, int]) -> None:
    with topic_sidecar(cluster, sockets, "r0", "--replicas", "2", "--replica", "0",
                       consumer="split") as first, \
            topic_sidecar(cluster, sockets, "r1", "--replicas", "2", consumer="split",
                          env={"NUMAFLOW_REPLICA": "1"}) as second:
        expect = [sum(1 for p in keyed_topic.values() if p in mine) for mine in ({0, 2}, {1})]

        async def both() -> list[dict[str, Any]]:
            return list(await asyncio.gather(
                drain(first.target, expect=expect[0], batch=7),
                drain(second.target, expect=expect[1], batch=7)))

        seen = run(both())
    assert [(s["partitions"], s["total"]) for s in seen] == [([0, 2], 3), ([1], 3)]
    assert [s["pending_after"] for s in seen] == [0, 0]
    assert [s["pending_before"] for s in seen] == expect
    for s, mine in zip(seen, ({0, 2}, {1}), strict=True):
        assert {r.offset.partition_id for r in s["results"]} == mine
        assert all(r.offset.partition_id == partition_of_offset(r) for r in s["results"])
    payloads = [r.payload for s in seen for r in s["results"]]
    assert sorted(payloads) == sorted(keyed_topic)  # together: every record, once


def test_topic_mode_bad_options_and_an_unknown_topic_end_it_with_one_line(
        cluster: LocalCluster, sockets: Path, keyed_topic: dict[bytes, int]) -> None:
    servers = ",".join(cluster.address(i) for i in (1, 2, 3))
    base = [sys.executable, "-m", "raftlog.node.cli", "numaflow-source", "--consumer", "c",
            "--socket", str(sockets / "bad.sock"), "--server", servers]
    cases = {
        "both": (["--topic", TOPIC, "--stream", "s"], 2,
                 "error: --stream and --topic exclude each other: give one"),
        "neither": ([], 2, "error: give either --stream S or --topic T"),
        "replica_range": (["--topic", TOPIC, "--replicas", "2", "--replica", "2"], 2,
                          "error: --replica is 2, but with --replicas 2 a replica is 0..1"),
        "unknown": (["--topic", "nosuch"], 1, "error: TOPIC_NOT_FOUND: "),
        "no_partition_left": (["--topic", TOPIC, "--replicas", "4", "--replica", "3"], 1,
                              "error: replica 3 of 4 gets no partition of topic 'nf.topic' "
                              "(3 partitions): run at most 3 replicas"),
    }
    for name, (extra, code, start) in cases.items():
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
        assert (done.returncode, done.stderr.count("\n")) == (code, 1), (name, done.stderr)
        assert done.stderr.startswith(start), (name, done.stderr)
    assert not (sockets / "bad.sock").exists()


def _primary(cluster: LocalCluster, stream: str, among: list[int]) -> int | None:
    for i in among:
        try:
            route = cluster.cluster(i).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s)
        except grpc.RpcError:
            continue
        if route.primary:
            return cluster.index_of(route.primary)
    return None


def test_kill_9_of_the_primary_during_reads_loses_no_ack_and_redelivers_the_rest(
        cluster: LocalCluster, sockets: Path) -> None:
    """Runs late: it kills a node of the module's cluster. A `--topic` sidecar reads beside
    the stream's: the killed node is also the primary of one of the topic's partitions."""
    count = 30
    published = make_stream(cluster, "fail", count=count)
    primary = _primary(cluster, "fail", [1, 2, 3])
    assert primary is not None
    topic_published = make_topic(cluster, FAIL_TOPIC)
    assert primary in {_primary(cluster, partition_stream(FAIL_TOPIC, p), [1, 2, 3])
                       for p in range(topic_partitions)}
    topic_read, killed = asyncio.Event(), asyncio.Event()

    async def drive(target: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
        async with source(target) as stub:
            reader, acker = await Reader(stub).open(), await Acker(stub).open()
            acked = await reader.read(10)
            await acker.ack([r.offset for r in acked])
            unacked = await reader.read(count)  # read, never acked
            await topic_read.wait()
            # A read waiting for records when the primary dies still ends with its EOT.
            waiting = asyncio.create_task(reader.read(count, timeout_ms=2_000))
            await asyncio.sleep(0.2)  # the read's Fetch is in flight
            await asyncio.to_thread(cluster.kill9, primary)
            killed.set()
            later: list[Any] = await waiting
            if later:
                await acker.ack([r.offset for r in later])
            deadline = time.monotonic() + failover_timeout_s
            while len({r.payload for r in later}) < count - 10 and time.monotonic() < deadline:
                batch = await reader.read(50)
                if batch:
                    await acker.ack([r.offset for r in batch])
                later += batch
            assert (await stub.IsReady(empty_pb2.Empty(), timeout=call_timeout_s)).ready
            await reader.close()
            await acker.close()
        return ([r.payload for r in acked], [r.payload for r in unacked],
                [r.payload for r in later])

    async def drive_topic(target: str) -> tuple[list[Any], list[Any], list[Any]]:
        async with source(target) as stub:
            reader, acker = await Reader(stub).open(), await Acker(stub).open()
            acked = await reader.read(12)
            await acker.ack([r.offset for r in acked])
            unacked = await reader.read(6)  # read, never acked
            topic_read.set()
            await killed.wait()
            later: list[Any] = []
            deadline = time.monotonic() + failover_timeout_s
            while (len({r.payload for r in later}) < topic_records - len(acked)
                   and time.monotonic() < deadline):
                batch = await reader.read(50)
                if batch:
                    await acker.ack([r.offset for r in batch])
                later += batch
            await reader.close()
            await acker.close()
        return acked, unacked, later

    async def both(target: str, topic_target: str) -> tuple[Any, Any]:
        return tuple(await asyncio.gather(drive(target), drive_topic(topic_target)))

    # The node each sidecar talks to is the primary: both fail at once.
    with sidecar(cluster, sockets, "fail", first=primary) as served, \
            topic_sidecar(cluster, sockets, "tfail", consumer="numa", topic=FAIL_TOPIC,
                          ack_wait=f"{ack_wait_ms}ms", first=primary) as topic_served:
        (acked, unacked, later), topic_reads = run(both(served.target, topic_served.target))
        assert served.process.poll() is None
        assert "trying the next node" in served.output()
        assert topic_served.process.poll() is None, topic_served.output()

    topic_acked, topic_unacked, topic_later = ([r.payload for r in reads]
                                               for reads in topic_reads)
    assert (len(topic_acked), len(topic_unacked)) == (12, 6)
    assert not set(topic_acked) & set(topic_later), "an acknowledged topic record came back"
    assert set(topic_later) == set(topic_published) - set(topic_acked), "a record was lost"
    assert all(r.offset.partition_id == partition_of_offset(r, topic=FAIL_TOPIC)
               == topic_published[r.payload] for reads in topic_reads for r in reads)

    assert acked == published[:10] and unacked == published[10:]
    assert not set(acked) & set(later), "an acknowledged record came back"
    assert set(later) == set(published[10:]), "a record was lost"
    survivor = next(i for i in (1, 2, 3) if i != primary)
    info = cluster.consumers(survivor).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
        stream="fail", consumer="numa"), timeout=call_timeout_s)
    assert (info.state.ack_floor, info.state.num_pending) == (count, 0)
    offsets = topics_api(cluster, survivor).GetTopicOffsets(topics_pb2.GetTopicOffsetsRequest(
        topic=FAIL_TOPIC, group="numa"), timeout=call_timeout_s)
    assert [(o.ack_floor, o.num_pending) for o in offsets.partitions] == [
        (o.last_seq, 0) for o in offsets.partitions]


def test_a_missing_consumer_is_a_clear_error_unless_asked_to_create_it(
        cluster: LocalCluster, sockets: Path) -> None:
    """After the kill: two of three nodes serve, the sidecar skips the dead one."""
    survivors = [i for i in (1, 2, 3) if i in cluster.running]
    cluster.streams(survivors[0]).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="late", subjects=["late.>"], replicas=3)),
        timeout=call_timeout_s)
    servers = ",".join(cluster.address(i) for i in (1, 2, 3))
    base = [sys.executable, "-m", "raftlog.node.cli", "numaflow-source", "--stream", "late",
            "--consumer", "absent", "--socket", str(sockets / "late.sock"), "--server", servers]
    done = subprocess.run(base, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ})
    assert done.returncode == 1, done.stderr
    assert "error: CONSUMER_NOT_FOUND: " in done.stderr, done.stderr
    assert not (sockets / "late.sock").exists()
    with sidecar(cluster, sockets, "late", "--create-consumer", "--ack-wait", "5s",
                 consumer="made") as served:
        assert served.process.poll() is None
    info = cluster.consumers(survivors[0]).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
        stream="late", consumer="made"), timeout=call_timeout_s)
    assert info.config.ack_wait_ms == 5_000
