"""Issue 14 items 1, 2, 3 and 6: a client generated at test time from the Waymaker seed document
drives all 37 client and admin RPCs of waymaker.streams.WaymakerStreamsService (streams,
consumers, sources, the nine object-store calls, transfer, cluster administration) on a 3-node
cluster, checking answers field by field against the seed's documented behaviour and its result
codes for bad input; the node's served methods (asked through server reflection) are the seed's
less the Replicate* ones, which answer UNIMPLEMENTED; the same streams and objects are seen
through raftlog.v1; and publish, fetch, ack, object reads and puts and a source tail carry on
through a kill -9 of the node leading the stream, its bucket and its source, with nothing
acknowledged lost. The last test checks that every served RPC was called.

The seed is found through RAFTLOG_SEEDS_DIR or <repo>/../shared/seeds; without it the client is
compiled from raftlog's own waymaker_streams.proto instead (same package, names and numbers), so
every behaviour check still runs, and only the two checks against the seed's text are skipped.
The proto text (the seed's from its `syntax` line on) is compiled with grpc_tools.protoc into a
temporary directory; the generated module gets a descriptor pool of its own, so it can be
imported beside raftlog.compat (which registers the same waymaker.streams names).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    objects_pb2,
    objects_pb2_grpc,
    streams_pb2,
    types_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = "003_320f4229e5c4e03d.txt"
COMPAT_PROTO = ROOT / "protos" / "raftlog" / "compat" / "waymaker_streams.proto"
SERVICE = "/waymaker.streams.WaymakerStreamsService/"
call_timeout_s = 15.0
ready_timeout_s = 30.0
recover_timeout_s = 30.0


# ------------------------------------------------------------------ the seed client

def seed_path() -> Path | None:
    for folder in (os.environ.get("RAFTLOG_SEEDS_DIR"), ROOT.parent / "shared" / "seeds"):
        if folder and (Path(folder) / SEED_FILE).is_file():
            return Path(folder) / SEED_FILE
    return None


def proto_text(seed: str) -> str:
    """The seed document from its `syntax` line on (it opens with a few header lines)."""
    start = seed.find('syntax = "proto3";')
    if start < 0:
        raise ValueError("the seed document holds no proto3 text")
    return seed[start:]


def client_proto() -> tuple[str, bool]:
    """The proto text the test client is compiled from, and whether it is the seed's: the
    seed document's when it is found, else raftlog's own waymaker_streams.proto (the seed's
    package, names and numbers, less the Replicate* RPCs), so that every behaviour check runs
    where the seed is absent too (e.g. a CI clone); only the checks against the seed's own
    text are skipped then."""
    seed = seed_path()
    if seed is not None:
        return proto_text(seed.read_text()), True
    return COMPAT_PROTO.read_text(), False


def skip_without_seed(wm: Any) -> None:
    if not wm.FROM_SEED:
        pytest.skip(f"the Waymaker seed {SEED_FILE} is not in RAFTLOG_SEEDS_DIR or "
                    "../shared/seeds: the client was compiled from raftlog's own proto")


def compile_seed(text: str, out: Path) -> tuple[ModuleType, ModuleType]:
    (out / "waymaker_streams.proto").write_text(text)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                    f"--grpc_python_out={out}", "waymaker_streams.proto"], check=True,
                   cwd=out, timeout=60)
    generated = out / "waymaker_streams_pb2.py"
    text = generated.read_text()
    if "_descriptor_pool.Default()" not in text:
        raise AssertionError("protoc's generated code changed shape; adapt compile_seed")
    generated.write_text(text.replace("_descriptor_pool.Default()",
                                      "_descriptor_pool.DescriptorPool()"))
    sys.path.insert(0, str(out))
    try:
        for name in ("waymaker_streams_pb2", "waymaker_streams_pb2_grpc"):
            sys.modules.pop(name, None)
        return (importlib.import_module("waymaker_streams_pb2"),
                importlib.import_module("waymaker_streams_pb2_grpc"))
    finally:
        sys.path.remove(str(out))


def seed_client(out: Path) -> Any:
    """The compiled client module (messages, plus `.grpc` for the stubs, `.FROM_SEED`)."""
    text, from_seed = client_proto()
    pb2, pb2_grpc = compile_seed(text, out)
    pb2.grpc = pb2_grpc  # one handle for messages and stubs
    pb2.FROM_SEED = from_seed
    return pb2


@pytest.fixture(scope="module")
def wm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield seed_client(tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, wm: Any) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("waymaker") / "cluster", nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Notes the method of every call made, and of every unary one answered with status OK
    (test_every_served_rpc_was_driven checks both at the end of the module)."""

    def __init__(self) -> None:
        self.called: set[str] = set()
        self.answered_ok: set[str] = set()

    def _note(self, details: Any) -> None:
        self.called.add(details.method.removeprefix(SERVICE))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self._note(details)
        outcome = continuation(details, request)
        if outcome.code() == grpc.StatusCode.OK:
            self.answered_ok.add(details.method.removeprefix(SERVICE))
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self._note(details)
        return continuation(details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        self._note(details)
        outcome = continuation(details, requests)
        if outcome.code() == grpc.StatusCode.OK:
            self.answered_ok.add(details.method.removeprefix(SERVICE))
        return outcome

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        self._note(details)
        return continuation(details, requests)


RECORDED = Recorder()


class Client:
    """Node i's WaymakerStreamsService stub; `admin(method)` is the metadata of an admin call."""

    def __init__(self, cluster: LocalCluster, wm: Any) -> None:
        self._cluster = cluster
        self._wm = wm
        self._channels: dict[int, grpc.Channel] = {}

    def __call__(self, i: int) -> Any:
        if i not in self._channels:
            self._channels[i] = grpc.intercept_channel(
                grpc.insecure_channel(self._cluster.address(i)), RECORDED)
        return self._wm.grpc.WaymakerStreamsServiceStub(self._channels[i])

    def admin(self, method: str) -> list[tuple[str, str]]:
        token = self._cluster.credential().token(principal="admin", method=SERVICE + method)
        return [("raftlog-admin-token", token)]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


@pytest.fixture(scope="module")
def way(cluster: LocalCluster, wm: Any) -> Iterator[Client]:
    client = Client(cluster, wm)
    try:
        yield client
    finally:
        client.close()


def until_ok(call: Callable[[], Any], *, what: str, timeout_s: float = ready_timeout_s) -> Any:
    """The first answer of `call` that is no UNAVAILABLE status (the cluster settling)."""
    answers: list[Any] = []

    def answered() -> bool:
        try:
            answers.append(call())
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            return False
        return True

    wait_until(answered, timeout_s, interval_s=0.1, what=what)
    return answers[-1]


def create_stream(way: Client, wm: Any, name: str, *, via: int = 1, **config: Any) -> None:
    reply = until_ok(lambda: way(via).CreateStream(wm.CreateStreamRequest(
        config=wm.StreamConfigPb(name=name, **config)), timeout=call_timeout_s),
        what=f"stream {name} created")
    assert (reply.success, reply.result_code, reply.message) == (True, "ok", "")
    until_ok(lambda: way(via).GetStreamInfo(wm.GetStreamInfoRequest(name=name),
                                            timeout=call_timeout_s),
             what=f"stream {name} served")  # its primary holds its lease


def new_consumer(wm: Any, stream: str, name: str, **config: Any) -> Any:
    return wm.CreateConsumerRequest(stream=stream, config=wm.ConsumerConfigPb(name=name,
                                                                              **config))


def failed(reply: Any, code: str) -> None:
    assert (reply.success, reply.result_code) == (False, code), reply
    assert reply.message


def publish(way: Client, wm: Any, stream: str, subject: str, payload: bytes, *, via: int = 1,
            **extra: Any) -> Any:
    return until_ok(lambda: way(via).Publish(wm.PublishRequest(
        stream=stream, subject=subject, payload=payload, **extra), timeout=call_timeout_s),
        what=f"publish to {stream}")


# ------------------------------------------------------------------ the proto

def test_the_served_proto_is_the_seed_on_the_wire(wm: Any) -> None:
    """raftlog.compat's waymaker_streams.proto has the seed's package, service, methods,
    messages, enums and fields (numbers, types, labels, optionals), less the Replicate* RPCs
    and the messages only they use."""
    skip_without_seed(wm)
    from google.protobuf import descriptor_pb2

    from raftlog.compat import waymaker_streams_pb2 as served

    seed, ours = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    wm.DESCRIPTOR.CopyToProto(seed)
    served.DESCRIPTOR.CopyToProto(ours)
    assert (ours.package, ours.service[0].name) == (seed.package, seed.service[0].name)
    left_out = {"PendingDeliveryPb", "ConsumerStateSnapshot", "SourceTailStateSnapshot"}
    seed_messages = {m.name: m for m in seed.message_type
                     if not m.name.startswith("Replicate") and m.name not in left_out}
    assert {m.name: m for m in ours.message_type} == seed_messages
    assert list(ours.enum_type) == list(seed.enum_type)
    seed_methods = [m for m in seed.service[0].method if not m.name.startswith("Replicate")]
    assert list(ours.service[0].method) == seed_methods
    assert len(seed_methods) == 37


def served_methods(address: str) -> dict[str, tuple[str, str, bool, bool]]:
    """The service's methods as the node describes them through server reflection:
    name -> (input type, output type, client streaming, server streaming)."""
    from google.protobuf import descriptor_pool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(address) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName(SERVICE.strip("/"))
        return {m.name: (m.input_type.full_name, m.output_type.full_name,
                         m.client_streaming, m.server_streaming) for m in service.methods}


def test_the_node_serves_the_seed_rpcs_less_replicate(cluster: LocalCluster, way: Client,
                                                      wm: Any) -> None:
    """What a node serves (asked through server reflection, not read from raftlog.compat) is
    the seed's service less its eight Replicate* RPCs, each method with the seed's types and
    streaming; a seed client calling a Replicate* method gets UNIMPLEMENTED."""
    skip_without_seed(wm)
    seed = {m.name: (m.input_type.full_name, m.output_type.full_name, m.client_streaming,
                     m.server_streaming)
            for m in wm.DESCRIPTOR.services_by_name["WaymakerStreamsService"].methods}
    replicate = sorted(name for name in seed if name.startswith("Replicate"))
    assert replicate == ["ReplicateConsumerState", "ReplicateMessage",
                         "ReplicateSourceTailState", "ReplicateStreamCreate",
                         "ReplicateStreamDelete", "ReplicateStreamUpdate", "ReplicateTruncate",
                         "ReplicateWorkQueueAck"]
    served = served_methods(cluster.address(2))
    assert served == {name: shape for name, shape in seed.items() if name not in replicate}
    assert len(served) == 37
    stub = way(3)
    for name in replicate:
        request = getattr(wm, f"{name}Request")()
        with pytest.raises(grpc.RpcError) as refused:
            getattr(stub, name)(request, timeout=call_timeout_s)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, name


# ------------------------------------------------------------------ streams

def test_stream_lifecycle_and_its_result_codes(way: Client, wm: Any) -> None:
    limits = wm.Retention(limits=wm.LimitsRetention(max_msgs=100, max_age_ms=3_600_000))
    create_stream(way, wm, "wm-orders", subjects_filter=["orders.>"], retention=limits,
                  max_msg_bytes=4096, block_size=500)

    failed(way(2).CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="wm-orders", subjects_filter=["orders.>"])), timeout=call_timeout_s),
        "already_exists")
    failed(way(2).CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="wm-eph", ephemeral=True)), timeout=call_timeout_s), "invalid_config")
    failed(way(2).CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="wm-src", sources=[wm.StreamSourceConfigPb(source_stream="wm-src")])),
        timeout=call_timeout_s), "invalid_config")
    failed(way(2).CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="bad name!")), timeout=call_timeout_s), "invalid_config")

    info = way(3).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-orders"),
                                timeout=call_timeout_s)
    assert (info.success, info.result_code) == (True, "ok")
    assert info.config.name == "wm-orders"
    assert list(info.config.subjects_filter) == ["orders.>"]
    assert info.config.retention.WhichOneof("policy") == "limits"
    bounds = info.config.retention.limits
    assert (bounds.max_msgs, bounds.max_age_ms, bounds.HasField("max_bytes")) == (
        100, 3_600_000, False)
    assert bounds.strict_limits  # raftlog prunes exactly
    assert (info.config.block_size, info.config.max_msg_bytes, info.config.ephemeral) == (
        1, 4096, False)
    assert (info.stats.last_seq, info.stats.msg_count, info.stats.block_count,
            info.stats.first_block) == (0, 0, 0, 0)
    assert info.ring_owner_node_id in (1, 2, 3)
    assert not info.HasField("authority_override")
    assert not info.pinned
    assert "wm-orders" in way(2).ListStreams(wm.ListStreamsRequest(),
                                             timeout=call_timeout_s).names

    for k in range(10):
        assert publish(way, wm, "wm-orders", "orders.eu", b"%d" % k, via=2).success
    updated = way(3).UpdateStream(wm.UpdateStreamRequest(name="wm-orders", max_msgs=4),
                                  timeout=call_timeout_s)
    assert (updated.success, updated.result_code, updated.pruned) == (True, "ok", 6)
    assert updated.config.retention.limits.max_msgs == 4
    assert updated.config.retention.limits.max_age_ms == 3_600_000  # absent: kept
    cleared = way(1).UpdateStream(wm.UpdateStreamRequest(name="wm-orders", max_age_ms=0),
                                  timeout=call_timeout_s)
    assert cleared.success and not cleared.config.retention.limits.HasField("max_age_ms")
    assert cleared.config.retention.limits.max_msgs == 4
    info = way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-orders"),
                                timeout=call_timeout_s)
    assert (info.stats.last_seq, info.stats.msg_count, info.stats.first_block,
            info.stats.block_count) == (10, 4, 7, 4)

    failed(way(1).UpdateStream(wm.UpdateStreamRequest(name="wm-orders", strict_limits=False),
                               timeout=call_timeout_s), "immutable_field")
    failed(way(1).UpdateStream(wm.UpdateStreamRequest(name="wm-nope", max_msgs=1),
                               timeout=call_timeout_s), "no_such_stream")
    failed(way(2).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-nope"),
                                timeout=call_timeout_s), "no_such_stream")

    create_stream(way, wm, "wm-gone", via=3,
                  retention=wm.Retention(work_queue=wm.WorkQueueRetention()))
    info = way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-gone"), timeout=call_timeout_s)
    assert info.config.retention.WhichOneof("policy") == "work_queue"
    deleted = way(1).DeleteStream(wm.DeleteStreamRequest(name="wm-gone"), timeout=call_timeout_s)
    assert (deleted.success, deleted.result_code) == (True, "ok")
    failed(way(2).DeleteStream(wm.DeleteStreamRequest(name="wm-gone"), timeout=call_timeout_s),
           "no_such_stream")
    # n3 lists what it has applied: the delete reaches it a moment later.
    wait_until(lambda: "wm-gone" not in way(3).ListStreams(wm.ListStreamsRequest(),
                                                           timeout=call_timeout_s).names,
               5, what="the delete applied on n3")


def test_publish_and_subject_reads(way: Client, wm: Any) -> None:
    create_stream(way, wm, "wm-kv", subjects_filter=["kv.>"], max_msg_bytes=64)
    first = publish(way, wm, "wm-kv", "kv.a", b"one", via=2, ts_ms=1_700_000_000_000,
                    headers=[wm.MessageHeader(key="k", value="v")], expected_last_seq=0)
    assert (first.success, first.result_code, first.seq) == (True, "ok", 1)
    assert publish(way, wm, "wm-kv", "kv.b", b"bee", via=3).seq == 2
    assert publish(way, wm, "wm-kv", "kv.a", b"two", expected_last_seq=1).seq == 3

    stale = publish(way, wm, "wm-kv", "kv.a", b"late", expected_last_seq=1)
    failed(stale, "wrong_revision")
    assert stale.seq == 3  # the current last seq at kv.a
    failed(publish(way, wm, "wm-kv", "other.x", b"x"), "subject_rejected")
    failed(publish(way, wm, "wm-kv", "kv.a", b"x" * 65), "oversize")
    failed(publish(way, wm, "wm-missing", "kv.a", b"x"), "no_such_stream")

    latest = way(3).ReadLatestAtSubject(wm.ReadLatestAtSubjectRequest(
        stream="wm-kv", subject="kv.a"), timeout=call_timeout_s)
    assert (latest.success, latest.result_code) == (True, "ok")
    assert (latest.latest.seq, latest.latest.subject, latest.latest.payload) == (
        3, "kv.a", b"two")
    older = way(1).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
        stream="wm-kv", subject="kv.a"), timeout=call_timeout_s)
    assert [(m.seq, m.payload) for m in older.messages] == [(1, b"one"), (3, b"two")]
    assert older.messages[0].ts_ms == 1_700_000_000_000  # the publisher's ts_ms
    assert [(h.key, h.value) for h in older.messages[0].headers] == [("k", "v")]
    assert older.messages[1].ts_ms > 1_700_000_000_000  # 0: the server's clock
    page = way(2).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
        stream="wm-kv", subject="kv.a", from_seq=2, limit=1), timeout=call_timeout_s)
    assert [m.seq for m in page.messages] == [3]
    empty = way(2).ReadLatestAtSubject(wm.ReadLatestAtSubjectRequest(
        stream="wm-kv", subject="kv.none"), timeout=call_timeout_s)
    assert (empty.success, empty.result_code, empty.HasField("latest")) == (True, "ok", False)
    subjects = way(1).ListSubjectsByPrefix(wm.ListSubjectsByPrefixRequest(
        stream="wm-kv", prefix="kv."), timeout=call_timeout_s)
    assert (subjects.success, sorted(subjects.subjects)) == (True, ["kv.a", "kv.b"])
    assert list(way(1).ListSubjectsByPrefix(wm.ListSubjectsByPrefixRequest(
        stream="wm-kv", prefix="kv.b"), timeout=call_timeout_s).subjects) == ["kv.b"]
    for reply in (
        way(1).ReadLatestAtSubject(wm.ReadLatestAtSubjectRequest(stream="wm-missing",
                                                                 subject="kv.a"),
                                   timeout=call_timeout_s),
        way(1).ListSubjectsByPrefix(wm.ListSubjectsByPrefixRequest(stream="wm-missing"),
                                    timeout=call_timeout_s),
        way(1).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(stream="wm-missing",
                                                               subject="kv.a"),
                                  timeout=call_timeout_s)):
        failed(reply, "no_such_stream")


# ------------------------------------------------------------------ consumers

def test_consumers_fetch_and_acknowledgements(way: Client, wm: Any) -> None:
    create_stream(way, wm, "wm-jobs", subjects_filter=["jobs.>"])
    for k in range(1, 6):
        assert publish(way, wm, "wm-jobs", f"jobs.{k}", b"job%d" % k).seq == k
    made = way(2).CreateConsumer(new_consumer(wm, "wm-jobs", "workers", filter_subject="jobs.>",
                                              ack_wait_ms=20_000), timeout=call_timeout_s)
    assert (made.success, made.result_code) == (True, "ok")
    failed(way(3).CreateConsumer(new_consumer(wm, "wm-jobs", "workers"), timeout=call_timeout_s),
           "already_exists")
    failed(way(3).CreateConsumer(new_consumer(wm, "wm-jobs", "grouped", deliver_group="g"),
                                 timeout=call_timeout_s), "invalid_config")
    failed(way(3).CreateConsumer(new_consumer(wm, "wm-none", "x"), timeout=call_timeout_s),
           "no_such_stream")

    info = way(1).GetConsumerInfo(wm.GetConsumerInfoRequest(stream="wm-jobs",
                                                            consumer="workers"),
                                  timeout=call_timeout_s)
    assert (info.success, info.consumer.config.name) == (True, "workers")
    config = info.consumer.config
    assert (config.filter_subject, config.ack_wait_ms, config.max_deliver) == ("jobs.>", 20_000, 5)
    assert config.delivery_policy.type == wm.DELIVERY_ALL
    assert info.consumer.created_at_ms > 0

    fetched = way(3).Fetch(wm.FetchRequest(stream="wm-jobs", consumer="workers", batch_size=3),
                           timeout=call_timeout_s)
    assert (fetched.success, fetched.result_code) == (True, "ok")
    assert [(m.seq, m.payload, m.deliver_count) for m in fetched.messages] == [
        (1, b"job1", 1), (2, b"job2", 1), (3, b"job3", 1)]
    for seq, call, request in ((1, way(1).Ack, wm.AckRequest),
                               (2, way(2).Nak, wm.NakRequest),
                               (3, way(3).InProgress, wm.InProgressRequest)):
        reply = call(request(stream="wm-jobs", consumer="workers", seq=seq),
                     timeout=call_timeout_s)
        assert (reply.success, reply.result_code) == (True, "ok"), (seq, reply)
    again = way(1).Fetch(wm.FetchRequest(stream="wm-jobs", consumer="workers", batch_size=10),
                         timeout=call_timeout_s)
    assert [(m.seq, m.deliver_count) for m in again.messages] == [(2, 2), (4, 1), (5, 1)]
    deferred = way(3).Nak(wm.NakRequest(stream="wm-jobs", consumer="workers", seq=4,
                                        delay_ms=60_000), timeout=call_timeout_s)
    assert (deferred.success, deferred.result_code) == (True, "ok")
    assert not way(1).Fetch(wm.FetchRequest(stream="wm-jobs", consumer="workers", batch_size=10),
                            timeout=call_timeout_s).messages  # seq 4 waits out its delay
    term = way(2).Term(wm.TermRequest(stream="wm-jobs", consumer="workers", seq=2),
                       timeout=call_timeout_s)
    assert (term.success, term.result_code) == (True, "ok")
    for seq in (3, 4, 5):
        assert way(seq % 3 + 1).Ack(wm.AckRequest(stream="wm-jobs", consumer="workers", seq=seq),
                                    timeout=call_timeout_s).success
    state = way(2).GetConsumerInfo(wm.GetConsumerInfoRequest(stream="wm-jobs",
                                                             consumer="workers"),
                                   timeout=call_timeout_s).consumer
    assert (state.ack_floor, state.last_delivered) == (5, 5)

    assert publish(way, wm, "wm-jobs", "jobs.6", b"job6").seq == 6
    failed(way(1).Ack(wm.AckRequest(stream="wm-jobs", consumer="workers", seq=6),
                      timeout=call_timeout_s), "not_delivered")
    failed(way(1).Fetch(wm.FetchRequest(stream="wm-jobs", consumer="nobody", batch_size=1),
                        timeout=call_timeout_s), "no_such_consumer")
    failed(way(1).Ack(wm.AckRequest(stream="wm-none", consumer="workers", seq=1),
                      timeout=call_timeout_s), "no_such_stream")
    failed(way(1).GetConsumerInfo(wm.GetConsumerInfoRequest(stream="wm-jobs", consumer="nobody"),
                                  timeout=call_timeout_s), "no_such_consumer")

    from_five = wm.DeliveryPolicyPb(type=wm.DELIVERY_BY_START_SEQ, start_seq=5)
    assert way(1).CreateConsumer(new_consumer(wm, "wm-jobs", "tail", delivery_policy=from_five),
                                 timeout=call_timeout_s).success
    listed = way(3).ListConsumers(wm.ListConsumersRequest(stream="wm-jobs"),
                                  timeout=call_timeout_s)
    assert listed.success
    by_name = {c.config.name: c for c in listed.consumers}
    assert set(by_name) == {"workers", "tail"}
    assert (by_name["tail"].config.delivery_policy.type,
            by_name["tail"].config.delivery_policy.start_seq) == (wm.DELIVERY_BY_START_SEQ, 5)

    events = list(way(2).Subscribe(wm.SubscribeRequest(
        stream="wm-jobs", consumer="tail", batch_size=1, stop_when_empty=True),
        timeout=call_timeout_s))
    assert [e.WhichOneof("event") for e in events] == ["message", "message", "stopped"]
    assert [e.message.seq for e in events[:2]] == [5, 6]
    assert events[2].stopped.reason
    with pytest.raises(grpc.RpcError) as missing:
        list(way(2).Subscribe(wm.SubscribeRequest(stream="wm-jobs", consumer="nobody"),
                              timeout=call_timeout_s))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND

    gone = way(3).DeleteConsumer(wm.DeleteConsumerRequest(stream="wm-jobs", consumer="tail"),
                                 timeout=call_timeout_s)
    assert (gone.success, gone.result_code) == (True, "ok")
    failed(way(1).DeleteConsumer(wm.DeleteConsumerRequest(stream="wm-jobs", consumer="tail"),
                                 timeout=call_timeout_s), "no_such_consumer")
    failed(way(1).ListConsumers(wm.ListConsumersRequest(stream="wm-none"),
                                timeout=call_timeout_s), "no_such_stream")


# ------------------------------------------------------------------ both APIs

def test_one_stream_through_both_apis(cluster: LocalCluster, way: Client, wm: Any) -> None:
    create_stream(way, wm, "wm-cross", via=2, subjects_filter=["x.>"])
    info = cluster.streams(3).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="wm-cross"),
                                            timeout=call_timeout_s)
    assert list(info.config.subjects) == ["x.>"]
    assert info.config.retention == types_pb2.RETENTION_POLICY_LIMITS
    ack = cluster.streams(1).Publish(streams_pb2.PublishRequest(
        stream="wm-cross", subject="x.1", payload=b"from v1"), timeout=call_timeout_s)
    assert ack.seq == 1
    assert way(3).CreateConsumer(new_consumer(wm, "wm-cross", "c"), timeout=call_timeout_s).success
    fetched = way(1).Fetch(wm.FetchRequest(stream="wm-cross", consumer="c", batch_size=5),
                           timeout=call_timeout_s)
    assert [(m.seq, m.payload) for m in fetched.messages] == [(1, b"from v1")]

    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name="v1-made", subjects=["v.>"], max_msgs=7, retention=types_pb2.RETENTION_POLICY_LIMITS)),
        timeout=call_timeout_s)
    cluster.consumers(2).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream="v1-made", config=consumers_pb2.ConsumerConfig(name="reader", max_deliver=0)),
        timeout=call_timeout_s)
    assert publish(way, wm, "v1-made", "v.a", b"from waymaker", via=3).seq == 1
    assert "v1-made" in way(1).ListStreams(wm.ListStreamsRequest(), timeout=call_timeout_s).names
    seen = way(2).GetStreamInfo(wm.GetStreamInfoRequest(name="v1-made"), timeout=call_timeout_s)
    assert (seen.config.retention.limits.max_msgs, seen.stats.last_seq) == (7, 1)
    reader = way(1).GetConsumerInfo(wm.GetConsumerInfoRequest(stream="v1-made",
                                                              consumer="reader"),
                                    timeout=call_timeout_s).consumer
    assert reader.config.max_deliver == 0xFFFF_FFFF  # raftlog's unlimited
    got = cluster.consumers(3).Fetch(consumers_pb2.FetchRequest(
        stream="v1-made", consumer="reader", batch=5), timeout=call_timeout_s)
    assert [m.payload for m in got.messages] == [b"from waymaker"]


# ------------------------------------------------------------------ object store

def create_bucket(cluster: LocalCluster, name: str) -> None:
    """The seed has no call that makes a bucket: raftlog.v1 Objects.CreateBucket does."""
    until_ok(lambda: objects_pb2_grpc.ObjectsStub(cluster.channel(1)).CreateBucket(
        objects_pb2.CreateBucketRequest(config=objects_pb2.BucketConfig(name=name)),
        timeout=call_timeout_s), what=f"bucket {name} created")


def put_frames(wm: Any, bucket: str, name: str, data: bytes, *, frame_bytes: int,
               sha256: str = "", finish: bool = True) -> Iterator[Any]:
    yield wm.PutObjectStreamFrame(start=wm.PutObjectStart(
        bucket=bucket, name=name, sha256=sha256,
        headers=[wm.MessageHeader(key="kind", value="streamed")]))
    for offset in range(0, len(data), frame_bytes):
        yield wm.PutObjectStreamFrame(data=data[offset:offset + frame_bytes])
    if finish:
        yield wm.PutObjectStreamFrame(finish=True)


def same_object(got: Any, put: Any) -> bool:
    """ObjectInfo of a read equals the put's, ts_ms included: both are the metadata message's
    own stamp (the primary's)."""
    return bool(got == put)


def test_objects_put_get_info_and_stream(cluster: LocalCluster, way: Client, wm: Any) -> None:
    create_bucket(cluster, "wmdocs")
    data = bytes(range(256)) * 13 + b"tail"  # 3332 bytes: 4 chunks of 1000, the last short
    digest = hashlib.sha256(data).hexdigest()
    put = until_ok(lambda: way(2).PutObject(wm.PutObjectRequest(
        bucket="wmdocs", name="a/report", payload=data, chunk_size=1000, sha256=digest,
        headers=[wm.MessageHeader(key="k", value="v")]), timeout=call_timeout_s),
        what="the bucket writable")
    assert (put.success, put.result_code, put.message) == (True, "ok", "")
    info = put.info
    assert (info.name, info.total_bytes, info.chunk_size, info.chunk_count, info.sha256) == (
        "a/report", len(data), 1000, 4, digest)
    assert [(h.key, h.value) for h in info.headers] == [("k", "v")]
    assert info.metadata_seq > 0 and info.ts_ms > 0 and not info.deduped

    got = way(3).GetObject(wm.GetObjectRequest(bucket="wmdocs", name="a/report"),
                           timeout=call_timeout_s)
    assert (got.success, got.result_code, got.payload) == (True, "ok", data)
    assert same_object(got.info, info), (got.info, info)
    about = way(1).GetObjectInfo(wm.GetObjectInfoRequest(bucket="wmdocs", name="a/report"),
                                 timeout=call_timeout_s)
    assert (about.result_code, about.deleted, about.info) == ("ok", False, got.info)
    v1 = objects_pb2_grpc.ObjectsStub(cluster.channel(1)).Get(objects_pb2.GetObjectRequest(
        bucket="wmdocs", name="a/report"), timeout=call_timeout_s)  # one store, two APIs
    assert (v1.payload, v1.info.revision) == (data, info.metadata_seq)

    frames = list(way(1).GetObjectStream(wm.GetObjectRequest(bucket="wmdocs", name="a/report"),
                                         timeout=call_timeout_s))
    assert frames[0].HasField("info") and frames[0].info == got.info and not frames[0].data
    assert [len(f.data) for f in frames[1:-1]] == [1000, 1000, 1000, 332]  # one per chunk
    assert (frames[-1].done, frames[-1].data, frames[-1].HasField("info")) == (True, b"", False)
    assert b"".join(f.data for f in frames[1:-1]) == data

    again = way(3).PutObject(wm.PutObjectRequest(bucket="wmdocs", name="a/report",
                                                 payload=b"second"), timeout=call_timeout_s)
    assert again.success and again.info.metadata_seq > info.metadata_seq  # a new revision
    assert (again.info.total_bytes, again.info.chunk_count, again.info.chunk_size) == (
        6, 1, 512 * 1024)  # chunk_size 0: raftlog's default, docs/objects.md
    empty = way(2).PutObject(wm.PutObjectRequest(bucket="wmdocs", name="a/empty"),
                             timeout=call_timeout_s)
    assert (empty.info.total_bytes, empty.info.chunk_count) == (0, 0)
    assert empty.info.sha256 == hashlib.sha256(b"").hexdigest()
    assert way(1).GetObject(wm.GetObjectRequest(bucket="wmdocs", name="a/empty"),
                            timeout=call_timeout_s).payload == b""

    big = bytes(range(251)) * 40  # 10040 bytes, frames of 2500: chunks of 2500
    streamed = way(2).PutObjectStream(put_frames(wm, "wmdocs", "b/streamed", big,
                                                 frame_bytes=2500,
                                                 sha256=hashlib.sha256(big).hexdigest()),
                                      timeout=call_timeout_s)
    assert (streamed.success, streamed.result_code) == (True, "ok"), streamed.message
    assert (streamed.info.name, streamed.info.total_bytes, streamed.info.chunk_size,
            streamed.info.chunk_count) == ("b/streamed", len(big), 2500, 5)
    assert [(h.key, h.value) for h in streamed.info.headers] == [("kind", "streamed")]
    read = way(3).GetObject(wm.GetObjectRequest(bucket="wmdocs", name="b/streamed"),
                            timeout=call_timeout_s)
    assert read.payload == big and same_object(read.info, streamed.info)

    for offset, length, want in ((900, 250, big[900:1150]),  # across a chunk boundary
                                 (10_000, 100, big[10_000:]),  # past the end: what there is
                                 (20_000, 10, b""),  # beyond the object: empty, ok
                                 (10_030, 0, big[10_030:])):  # len 0: the tail (docs)
        ranged = way(1).GetObjectRange(wm.GetObjectRangeRequest(
            bucket="wmdocs", name="b/streamed", offset=offset, len=length),
            timeout=call_timeout_s)
        assert (ranged.success, ranged.result_code, ranged.payload) == (True, "ok", want)
        assert ranged.actual_offset == min(offset, len(big))
        assert ranged.info == read.info


def test_objects_tombstones_revisions_lists_and_result_codes(cluster: LocalCluster,
                                                             way: Client, wm: Any) -> None:
    create_bucket(cluster, "wmrev")
    first = until_ok(lambda: way(1).PutObject(wm.PutObjectRequest(
        bucket="wmrev", name="doc", payload=b"v1"), timeout=call_timeout_s),
        what="the bucket writable").info
    second = way(2).PutObject(wm.PutObjectRequest(bucket="wmrev", name="doc", payload=b"v2!"),
                              timeout=call_timeout_s).info
    assert way(3).PutObject(wm.PutObjectRequest(bucket="wmrev", name="other", payload=b"o"),
                            timeout=call_timeout_s).success
    gone = way(3).DeleteObject(wm.DeleteObjectRequest(bucket="wmrev", name="doc"),
                               timeout=call_timeout_s)
    assert (gone.success, gone.result_code) == (True, "ok")
    assert gone.tombstone_seq > second.metadata_seq > first.metadata_seq

    info = way(1).GetObjectInfo(wm.GetObjectInfoRequest(bucket="wmrev", name="doc"),
                                timeout=call_timeout_s)
    assert (info.success, info.result_code, info.deleted, info.HasField("info")) == (
        True, "ok", True, False)
    failed(way(2).GetObject(wm.GetObjectRequest(bucket="wmrev", name="doc"),
                            timeout=call_timeout_s), "no_such_object")
    failed(way(2).GetObjectRange(wm.GetObjectRangeRequest(bucket="wmrev", name="doc",
                                                          len=1), timeout=call_timeout_s),
           "no_such_object")
    with pytest.raises(grpc.RpcError) as streamed:
        list(way(3).GetObjectStream(wm.GetObjectRequest(bucket="wmrev", name="doc"),
                                    timeout=call_timeout_s))
    assert streamed.value.code() == grpc.StatusCode.NOT_FOUND
    again = way(1).DeleteObject(wm.DeleteObjectRequest(bucket="wmrev", name="doc"),
                                timeout=call_timeout_s)
    assert (again.success, again.result_code, again.tombstone_seq) == (True, "ok", 0)

    revisions = way(2).ListObjectRevisions(wm.ListObjectRevisionsRequest(
        bucket="wmrev", name="doc"), timeout=call_timeout_s)
    assert (revisions.success, revisions.result_code) == (True, "ok")
    assert [(r.metadata_seq, r.deleted, r.total_bytes, r.chunk_count, r.sha256)
            for r in revisions.revisions] == [
        (first.metadata_seq, False, 2, 1, hashlib.sha256(b"v1").hexdigest()),
        (second.metadata_seq, False, 3, 1, hashlib.sha256(b"v2!").hexdigest()),
        (gone.tombstone_seq, True, 0, 0, "")]
    assert all(r.ts_ms > 0 for r in revisions.revisions)
    later = way(3).ListObjectRevisions(wm.ListObjectRevisionsRequest(
        bucket="wmrev", name="doc", from_seq=first.metadata_seq + 1, limit=1),
        timeout=call_timeout_s)
    assert [r.metadata_seq for r in later.revisions] == [second.metadata_seq]

    live = way(1).ListObjects(wm.ListObjectsRequest(bucket="wmrev"), timeout=call_timeout_s)
    assert (live.success, [(e.name, e.total_bytes, e.deleted) for e in live.entries]) == (
        True, [("other", 1, False)])
    every = way(2).ListObjects(wm.ListObjectsRequest(bucket="wmrev", include_deleted=True),
                               timeout=call_timeout_s)
    assert sorted((e.name, e.deleted) for e in every.entries) == [("doc", True),
                                                                   ("other", False)]
    prefixed = way(3).ListObjects(wm.ListObjectsRequest(bucket="wmrev", name_prefix="oth"),
                                  timeout=call_timeout_s)
    assert [e.name for e in prefixed.entries] == ["other"]

    wrong = hashlib.sha256(b"something else").hexdigest()
    failed(way(2).PutObject(wm.PutObjectRequest(bucket="wmrev", name="bad", payload=b"x",
                                                sha256=wrong), timeout=call_timeout_s),
           "sha_mismatch")
    failed(way(3).PutObjectStream(put_frames(wm, "wmrev", "bad", b"x" * 3000, frame_bytes=1000,
                                             sha256=wrong), timeout=call_timeout_s),
           "sha_mismatch")
    failed(way(1).GetObjectInfo(wm.GetObjectInfoRequest(bucket="wmrev", name="bad"),
                                timeout=call_timeout_s), "no_such_object")  # nothing stored
    failed(way(1).PutObject(wm.PutObjectRequest(bucket="wmrev", name="dd", payload=b"x",
                                                dedupe=True), timeout=call_timeout_s),
           "invalid_config")
    for reply in (
        way(1).PutObject(wm.PutObjectRequest(bucket="wmnone", name="a", payload=b"x"),
                         timeout=call_timeout_s),
        way(2).PutObjectStream(put_frames(wm, "wmnone", "a", b"x", frame_bytes=1),
                               timeout=call_timeout_s),
        way(3).GetObject(wm.GetObjectRequest(bucket="wmnone", name="a"),
                         timeout=call_timeout_s),
        way(1).DeleteObject(wm.DeleteObjectRequest(bucket="wmnone", name="a"),
                            timeout=call_timeout_s),
        way(2).GetObjectInfo(wm.GetObjectInfoRequest(bucket="wmnone", name="a"),
                             timeout=call_timeout_s),
        way(3).ListObjects(wm.ListObjectsRequest(bucket="wmnone"), timeout=call_timeout_s),
        way(1).ListObjectRevisions(wm.ListObjectRevisionsRequest(bucket="wmnone", name="a"),
                                   timeout=call_timeout_s),
        way(2).GetObjectRange(wm.GetObjectRangeRequest(bucket="wmnone", name="a"),
                              timeout=call_timeout_s)):
        failed(reply, "no_such_bucket")
    with pytest.raises(grpc.RpcError) as missing:
        list(way(3).GetObjectStream(wm.GetObjectRequest(bucket="wmnone", name="a"),
                                    timeout=call_timeout_s))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------ sources

def test_a_sourcing_stream_and_get_stream_sources(way: Client, wm: Any) -> None:
    create_stream(way, wm, "wm-origin", subjects_filter=["orders.>"])
    for k, subject in enumerate(("orders.eu.new", "orders.us.new", "orders.eu.paid")):
        assert publish(way, wm, "wm-origin", subject, b"%d" % k, via=k % 3 + 1).seq == k + 1
    wanted = wm.StreamSourceConfigPb(
        source_stream="wm-origin", filter_subject="orders.eu.>",
        subject_transform=wm.SubjectTransformPb(source_pattern="orders.*.>",
                                                destination="audit.{{wildcard(1)}}"),
        max_initial_backfill=100, on_drop=wm.ON_DROP_SKIP_TO_FIRST_AVAILABLE)
    create_stream(way, wm, "wm-audit", via=2, sources=[wanted])

    def copied() -> list[tuple[str, bytes]]:
        scan = way(3).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
            stream="wm-audit", subject="audit.eu"), timeout=call_timeout_s)
        return [(m.subject, m.payload) for m in scan.messages]

    wait_until(lambda: copied() == [("audit.eu", b"0"), ("audit.eu", b"2")], 20,
               interval_s=0.2, what="the two eu orders copied")
    info = way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-audit"),
                                timeout=call_timeout_s)
    assert list(info.config.sources) == [wanted]
    assert [(s.source_stream, s.last_sourced_seq, s.pulled_total, s.last_error,
             s.last_error_ts_ms) for s in info.sources_status] == [("wm-origin", 3, 2, "", 0)]
    for i in (1, 2, 3):  # any node lists every tail of the cluster
        listed = way(i).GetStreamSources(wm.GetStreamSourcesRequest(), timeout=call_timeout_s)
        assert (listed.success, listed.result_code, listed.message) == (True, "ok", "")
        assert [(e.source_stream, e.last_sourced_seq, e.pulled_total, e.last_error)
                for e in listed.entries if e.sourcing_stream == "wm-audit"] == [
            ("wm-origin", 3, 2, "")]
    origin = way(3).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-origin"),
                                  timeout=call_timeout_s)
    assert not origin.sources_status  # no sources of its own
    failed(way(3).CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="wm-badsrc", sources=[wm.StreamSourceConfigPb(
            source_stream="wm-origin", subject_transform=wm.SubjectTransformPb(
                source_pattern="orders.*", destination="x.{{wildcard(2)}}"))])),
        timeout=call_timeout_s), "invalid_config")


# ------------------------------------------------------------------ transfer

def test_transfer_stream_sends_every_message_framed(cluster: LocalCluster, way: Client,
                                                    wm: Any) -> None:
    create_stream(way, wm, "wm-move", subjects_filter=["m.>"])
    sent = [publish(way, wm, "wm-move", f"m.{k % 3}", bytes([k]) * (k * 50), via=k % 3 + 1).seq
            for k in range(1, 31)]
    assert sent == list(range(1, 31))
    for i in (1, 2, 3):  # served wherever the call lands
        chunks = list(way(i).TransferStream(wm.TransferStreamRequest(name="wm-move"),
                                            timeout=call_timeout_s))
        assert [c.WhichOneof("body") for c in chunks][-1] == "summary"
        assert all(c.WhichOneof("body") == "data" for c in chunks[:-1])
        data = b"".join(c.data for c in chunks[:-1])
        summary = chunks[-1].summary
        assert (summary.total_bytes, summary.stream_last_seq) == (len(data), 30)
        messages = []
        offset = 0
        while offset < len(data):
            (size,) = struct.unpack_from(">I", data, offset)
            messages.append(types_pb2.Message.FromString(data[offset + 4:offset + 4 + size]))
            offset += 4 + size
        assert [(m.seq, m.subject, m.payload) for m in messages] == [
            (k, f"m.{k % 3}", bytes([k]) * (k * 50)) for k in range(1, 31)]
    with pytest.raises(grpc.RpcError) as missing:
        list(way(1).TransferStream(wm.TransferStreamRequest(name="wm-nothing"),
                                   timeout=call_timeout_s))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    # The stream stays: raftlog replicates it; MigrateStream moves its primary.
    assert way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-move"),
                                timeout=call_timeout_s).stats.msg_count == 30


def unframed(chunks: list[Any]) -> tuple[list[types_pb2.Message], Any]:
    """The messages of a TransferStream's data chunks (4-byte big-endian length + a
    raftlog.v1.Message each, as docs/waymaker.md describes) and its closing summary."""
    assert [c.WhichOneof("body") for c in chunks][-1] == "summary"
    assert all(c.WhichOneof("body") == "data" for c in chunks[:-1])
    assert all(len(c.data) <= 1024 * 1024 for c in chunks[:-1])
    data = b"".join(c.data for c in chunks[:-1])
    assert chunks[-1].summary.total_bytes == len(data)
    messages, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from(">I", data, offset)
        messages.append(types_pb2.Message.FromString(data[offset + 4:offset + 4 + size]))
        offset += 4 + size
    return messages, chunks[-1].summary


def test_transfer_of_thousands_of_messages_through_a_non_primary(cluster: LocalCluster,
                                                                 way: Client,
                                                                 wm: Any) -> None:
    """3,100 messages of 2 KB published, the first 100 pruned by max_msgs: the transfer
    through a node that is not the stream's primary sends the 3,000 left (more than one
    ReadMessages page of 4 MiB), in order, framed."""
    limits_3000 = wm.Retention(limits=wm.LimitsRetention(max_msgs=3000))
    create_stream(way, wm, "wm-bulk", subjects_filter=["bulk.>"], retention=limits_3000)
    payload = bytes(range(250)) * 8
    for first in range(0, 3100, 620):
        reply = cluster.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(
            stream="wm-bulk", entries=[streams_pb2.PublishEntry(
                subject=f"bulk.{k % 7}", payload=payload + b"%d" % k)
                for k in range(first, first + 620)]), timeout=60)
        assert (reply.acked, reply.failed) == (620, 0)
    elsewhere = next(i for i in (1, 2, 3) if f"n{i}" != primary_of(cluster, "wm-bulk"))
    started = time.monotonic()
    chunks = list(way(elsewhere).TransferStream(wm.TransferStreamRequest(name="wm-bulk"),
                                                timeout=60))
    took_s = time.monotonic() - started
    messages, summary = unframed(chunks)
    assert summary.stream_last_seq == 3100
    assert [m.seq for m in messages] == list(range(101, 3101))
    assert all((m.subject, m.payload) == (f"bulk.{(m.seq - 1) % 7}",
                                          payload + b"%d" % (m.seq - 1)) for m in messages)
    print(f"TransferStream of 3,000 messages ({summary.total_bytes / 1e6:.1f} MB) through "
          f"n{elsewhere}, not the primary: {took_s * 1000:.0f} ms")


# ------------------------------------------------------------------ cluster administration

def primary_of(cluster: LocalCluster, stream: str, *, via: int = 1) -> str:
    """The stream's primary; for a stream not created yet, the one it would get."""
    route: cluster_pb2.RouteExplanation = cluster.cluster(via).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s)
    return route.primary


def test_migrate_pin_clear_rebalance_and_stats(cluster: LocalCluster, way: Client,
                                               wm: Any) -> None:
    create_stream(way, wm, "wm-admin")
    for k in range(5):
        assert publish(way, wm, "wm-admin", "a", b"%d" % k).success
    primary = primary_of(cluster, "wm-admin")
    target = next(i for i in (1, 2, 3) if f"n{i}" != primary)
    source = int(primary.removeprefix("n"))

    with pytest.raises(grpc.RpcError) as refused:
        way(target).MigrateStream(wm.MigrateStreamRequest(name="wm-admin",
                                                          source_node_id=source),
                                  timeout=call_timeout_s)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    moved = way(target).MigrateStream(wm.MigrateStreamRequest(
        name="wm-admin", source_node_id=source), metadata=way.admin("MigrateStream"),
        timeout=60)
    assert (moved.success, moved.result_code) == (True, "ok"), moved
    assert (moved.stream_last_seq, moved.total_bytes > 0) == (5, True)
    wait_until(lambda: primary_of(cluster, "wm-admin") == f"n{target}", 10,
               what=f"wm-admin led by n{target} ({moved.message})")
    failed(way(target).MigrateStream(wm.MigrateStreamRequest(
        name="wm-admin", source_node_id=source), metadata=way.admin("MigrateStream"),
        timeout=60), "already_exists")
    failed(way(target).MigrateStream(wm.MigrateStreamRequest(
        name="wm-admin", source_node_id=99), metadata=way.admin("MigrateStream"),
        timeout=60), "source_unreachable")

    info = way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-admin"), timeout=call_timeout_s)
    assert info.HasField("authority_override")
    assert info.authority_override.claimant_node_id == target
    assert info.authority_override.fence_epoch > 0

    def overrides_on_n2() -> list[tuple[int, bool]]:
        overrides = way(2).ListStreamAuthorityOverrides(
            wm.ListStreamAuthorityOverridesRequest(), timeout=call_timeout_s)
        assert overrides.success
        return [(e.claimant_node_id, e.fence_epoch > 0) for e in overrides.entries
                if e.stream == "wm-admin"]

    wait_until(lambda: overrides_on_n2() == [(target, True)], 5, what="the override on n2")

    pinned = way(3).SetStreamPinned(wm.SetStreamPinnedRequest(stream="wm-admin", pinned=True),
                                    metadata=way.admin("SetStreamPinned"), timeout=call_timeout_s)
    assert (pinned.success, pinned.result_code) == (True, "ok")
    # Another node applies the Raft entry a moment later (the seed allows that apply lag).
    wait_until(lambda: way(1).GetStreamInfo(wm.GetStreamInfoRequest(name="wm-admin"),
                                            timeout=call_timeout_s).pinned, 5,
               what="the pin seen on n1")
    assert way(3).SetStreamPinned(wm.SetStreamPinnedRequest(stream="wm-admin", pinned=False),
                                  metadata=way.admin("SetStreamPinned"),
                                  timeout=call_timeout_s).success
    cleared = way(2).ClearStreamAuthority(wm.ClearStreamAuthorityRequest(stream="wm-admin"),
                                          metadata=way.admin("ClearStreamAuthority"),
                                          timeout=call_timeout_s)
    assert (cleared.success, cleared.result_code) == (True, "ok")
    again = way(2).ClearStreamAuthority(wm.ClearStreamAuthorityRequest(stream="wm-admin"),
                                        metadata=way.admin("ClearStreamAuthority"),
                                        timeout=call_timeout_s)
    assert again.success  # idempotent
    wait_until(lambda: not way(1).GetStreamInfo(
        wm.GetStreamInfoRequest(name="wm-admin"),
        timeout=call_timeout_s).HasField("authority_override"), 5, what="the clear seen on n1")

    no_plan = way(1).RebalanceStreams(wm.RebalanceStreamsRequest(),
                                      metadata=way.admin("RebalanceStreams"),
                                      timeout=call_timeout_s)
    failed(no_plan, "no_plan")
    here = primary_of(cluster, "wm-admin")
    plan = way(1).RebalanceStreams(wm.RebalanceStreamsRequest(plan=[
        wm.RebalancePlanEntry(name="wm-admin", target_node_id=int(here.removeprefix("n"))),
        wm.RebalancePlanEntry(name="wm-unknown", target_node_id=1)]),
        metadata=way.admin("RebalanceStreams"), timeout=60)
    assert (plan.success, plan.result_code) == (False, "partial")
    assert [(s.name, s.success, s.result_code) for s in plan.steps] == [
        ("wm-admin", True, "skipped_same_node"), ("wm-unknown", False, "no_source")]

    elsewhere = next(i for i in (1, 2, 3) if f"n{i}" != here)
    hurried = way(3).RebalanceStreams(wm.RebalanceStreamsRequest(plan=[
        wm.RebalancePlanEntry(name="wm-admin", target_node_id=elsewhere)],
        per_step_timeout_ms=1), metadata=way.admin("RebalanceStreams"), timeout=60)
    assert (hurried.result_code, hurried.steps[0].result_code) == ("partial", "internal")
    assert "did not finish" in hurried.steps[0].message
    wait_until(lambda: primary_of(cluster, "wm-admin") == f"n{elsewhere}", 20,
               what="the timed-out move finished in the background")
    here = f"n{elsewhere}"

    stats = way(2).GetClusterStreamStats(wm.GetClusterStreamStatsRequest(
        include_per_stream=True), timeout=call_timeout_s)
    assert (stats.success, stats.result_code) == (True, "ok")
    assert sorted(n.node_id for n in stats.nodes) == [1, 2, 3]
    assert {n.status for n in stats.nodes} == {"ok"}
    assert stats.total_stream_count == sum(n.stream_count for n in stats.nodes)
    assert stats.total_stream_count == len(stats.streams) >= 1
    counts = [n.stream_count for n in stats.nodes]
    assert stats.skew_count == max(counts) - min(counts)
    row = next(s for s in stats.streams if s.name == "wm-admin")
    assert (row.msg_count, row.last_seq, row.owner_node_id) == (5, 5, int(here.removeprefix("n")))
    local = way(2).GetClusterStreamStats(wm.GetClusterStreamStatsRequest(local_only=True),
                                         timeout=call_timeout_s)
    assert [n.node_id for n in local.nodes] == [2] and not local.streams
    local = way(2).GetClusterStreamStats(wm.GetClusterStreamStatsRequest(
        local_only=True, include_per_stream=True), timeout=call_timeout_s)
    (mine,) = [n for n in stats.nodes if n.node_id == 2]
    assert (local.total_stream_count, local.skew_count) == (mine.stream_count, 0)
    assert sorted(s.name for s in local.streams) == sorted(
        s.name for s in stats.streams if s.owner_node_id == 2)


def test_watch_streams_reports_changes(way: Client, wm: Any) -> None:
    events: queue.Queue[Any] = queue.Queue()
    call = way(2).WatchStreams(wm.WatchStreamsRequest(), timeout=60)

    def read() -> None:
        try:
            for event in call:
                events.put(event)
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(0.5)  # the watch is registered on the node before the changes
        create_stream(way, wm, "wm-watched", via=1)
        assert way(3).CreateConsumer(new_consumer(wm, "wm-watched", "w"),
                                     timeout=call_timeout_s).success
        assert way(1).DeleteStream(wm.DeleteStreamRequest(name="wm-watched"),
                                   timeout=call_timeout_s).success
        seen: list[tuple[int, str]] = []

        def got_all() -> bool:
            while not events.empty():
                event = events.get()
                assert event.node_id == 2 and event.ts_ms > 0
                detail = event.WhichOneof("detail")
                name = (event.stream.name if detail == "stream" else
                        event.consumer.stream + "/" + event.consumer.consumer
                        if detail == "consumer" else event.authority.stream)
                if name.startswith("wm-watched"):
                    seen.append((event.type, name))
            return (wm.WATCH_STREAM_DELETED, "wm-watched") in seen

        wait_until(got_all, 20, what="watch events")
        assert seen[0] == (wm.WATCH_STREAM_CREATED, "wm-watched")
        assert (wm.WATCH_CONSUMER_CREATED, "wm-watched/w") in seen
    finally:
        call.cancel()
        reader.join(timeout=5)


# ------------------------------------------------------------------ failover (last: kills a node)

def test_publish_fetch_ack_objects_and_sources_carry_on_through_a_primary_kill(
        cluster: LocalCluster, way: Client, wm: Any) -> None:
    """kill -9 of the node that leads a stream, a bucket and maybe the stream's sourcing copy:
    publish, fetch and ack go on with nothing acknowledged lost; objects stored before are read
    whole and new ones put (unary and streamed) through the survivors; the copy's tail goes on
    to the last seq; the cluster stats report the dead node, a local_only ask does not need it."""
    create_stream(way, wm, "wm-failover", subjects_filter=["f.>"])
    primary = primary_of(cluster, "wm-failover")
    victim = int(primary.removeprefix("n"))
    survivors = [i for i in (1, 2, 3) if i != victim]
    bucket = next(f"wmfail{k}" for k in range(64)
                  if primary_of(cluster, f"OBJ_wmfail{k}") == primary)  # led by the victim
    create_bucket(cluster, bucket)
    assert primary_of(cluster, f"OBJ_{bucket}") == primary
    kept = bytes(range(256)) * 20
    stored = until_ok(lambda: way(survivors[0]).PutObject(wm.PutObjectRequest(
        bucket=bucket, name="kept", payload=kept, chunk_size=2048), timeout=call_timeout_s),
        what="the bucket writable").info
    assert stored.chunk_count == 3
    create_stream(way, wm, "wm-failover-copy", via=survivors[1], sources=[
        wm.StreamSourceConfigPb(source_stream="wm-failover")])
    assert way(survivors[0]).CreateConsumer(wm.CreateConsumerRequest(
        stream="wm-failover", config=wm.ConsumerConfigPb(name="c", ack_wait_ms=2_000)),
        timeout=call_timeout_s).success
    acknowledged: dict[int, bytes] = {}
    for k in range(20):
        reply = publish(way, wm, "wm-failover", "f.x", b"before-%d" % k, via=survivors[k % 2])
        assert reply.success
        acknowledged[reply.seq] = b"before-%d" % k
    fetched = way(survivors[0]).Fetch(wm.FetchRequest(stream="wm-failover", consumer="c",
                                                      batch_size=10), timeout=call_timeout_s)
    delivered = {m.seq: m.payload for m in fetched.messages}
    for seq in list(delivered)[:5]:
        assert way(survivors[1]).Ack(wm.AckRequest(stream="wm-failover", consumer="c", seq=seq),
                                     timeout=call_timeout_s).success

    cluster.kill9(victim)
    def publish_after(via: int, payload: bytes) -> Any:
        return until_ok(lambda: way(via).Publish(wm.PublishRequest(
            stream="wm-failover", subject="f.x", payload=payload), timeout=5),
            what="publish after the kill", timeout_s=recover_timeout_s)

    for k in range(20):
        reply = publish_after(survivors[k % 2], b"after-%d" % k)
        assert (reply.success, reply.result_code) == (True, "ok"), reply
        acknowledged[reply.seq] = b"after-%d" % k
    assert primary_of(cluster, "wm-failover", via=survivors[0]) != primary

    def drained() -> bool:
        reply = until_ok(lambda: way(survivors[0]).Fetch(wm.FetchRequest(
            stream="wm-failover", consumer="c", batch_size=100), timeout=5),
            what="fetch after the kill", timeout_s=recover_timeout_s)
        assert reply.success, reply
        for message in reply.messages:
            delivered[message.seq] = message.payload
            assert way(survivors[1]).Ack(wm.AckRequest(stream="wm-failover", consumer="c",
                                                       seq=message.seq), timeout=5).success
        info = way(survivors[1]).GetConsumerInfo(wm.GetConsumerInfoRequest(
            stream="wm-failover", consumer="c"), timeout=5).consumer
        return info.ack_floor >= max(acknowledged)

    wait_until(drained, recover_timeout_s, interval_s=0.2, what="every message acknowledged")
    assert {seq: delivered[seq] for seq in acknowledged} == acknowledged
    scan = way(survivors[1]).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
        stream="wm-failover", subject="f.x"), timeout=call_timeout_s)
    assert {m.seq: m.payload for m in scan.messages} == acknowledged

    got = until_ok(lambda: way(survivors[1]).GetObject(wm.GetObjectRequest(
        bucket=bucket, name="kept"), timeout=5), what="the bucket served again",
        timeout_s=recover_timeout_s)
    assert (got.success, got.result_code, got.payload) == (True, "ok", kept)
    assert same_object(got.info, stored)
    assert primary_of(cluster, f"OBJ_{bucket}", via=survivors[0]) != primary
    put = way(survivors[0]).PutObject(wm.PutObjectRequest(bucket=bucket, name="new",
                                                          payload=b"after the kill"),
                                      timeout=call_timeout_s)
    assert (put.success, put.result_code) == (True, "ok"), put.message
    assert put.info.metadata_seq > stored.metadata_seq
    streamed = way(survivors[1]).PutObjectStream(put_frames(wm, bucket, "kept", kept[::-1],
                                                            frame_bytes=1000),
                                                 timeout=call_timeout_s)
    assert (streamed.success, streamed.info.chunk_count) == (True, 6), streamed.message
    frames = list(way(survivors[0]).GetObjectStream(wm.GetObjectRequest(bucket=bucket,
                                                                         name="kept"),
                                                    timeout=call_timeout_s))
    assert same_object(frames[0].info, streamed.info) and frames[-1].done
    assert b"".join(f.data for f in frames[1:-1]) == kept[::-1]
    ranged = way(survivors[1]).GetObjectRange(wm.GetObjectRangeRequest(
        bucket=bucket, name="kept", offset=990, len=20), timeout=call_timeout_s)
    assert (ranged.result_code, ranged.payload) == ("ok", kept[::-1][990:1010])
    revisions = way(survivors[0]).ListObjectRevisions(wm.ListObjectRevisionsRequest(
        bucket=bucket, name="kept"), timeout=call_timeout_s)
    assert [r.metadata_seq for r in revisions.revisions] == [stored.metadata_seq,
                                                             streamed.info.metadata_seq]
    listed = way(survivors[1]).ListObjects(wm.ListObjectsRequest(bucket=bucket),
                                           timeout=call_timeout_s)
    assert sorted((e.name, e.total_bytes) for e in listed.entries) == [
        ("kept", len(kept)), ("new", 14)]

    last = max(acknowledged)

    def copied_through_the_last() -> bool:
        listed = way(survivors[0]).GetStreamSources(wm.GetStreamSourcesRequest(), timeout=5)
        return [e.last_sourced_seq for e in listed.entries
                if e.sourcing_stream == "wm-failover-copy"] == [last]

    wait_until(copied_through_the_last, recover_timeout_s, interval_s=0.2,
               what="the copy's tail at the source's last seq")
    copy = way(survivors[1]).ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
        stream="wm-failover-copy", subject="f.x"), timeout=call_timeout_s)
    assert [m.payload for m in copy.messages] == [acknowledged[seq]
                                                  for seq in sorted(acknowledged)]

    stats = way(survivors[0]).GetClusterStreamStats(wm.GetClusterStreamStatsRequest(),
                                                    timeout=call_timeout_s)
    assert {n.node_id: n.status for n in stats.nodes} == {
        victim: "unreachable", survivors[0]: "ok", survivors[1]: "ok"}
    local = way(survivors[1]).GetClusterStreamStats(wm.GetClusterStreamStatsRequest(
        local_only=True), timeout=call_timeout_s)
    assert [(n.node_id, n.status) for n in local.nodes] == [(survivors[1], "ok")]


def test_every_served_rpc_was_driven(request: pytest.FixtureRequest, cluster: LocalCluster,
                                     wm: Any) -> None:
    """Last: the tests above called each of the 37 served RPCs through the seed client, and
    each unary one answered at least once with status OK (a result, not a refusal). Skipped
    when only part of the module ran (-k)."""
    module_tests = {name for name, value in globals().items()
                    if name.startswith("test_") and callable(value)}
    ran = {item.name for item in request.session.items if item.module is sys.modules[__name__]}
    if ran != module_tests:
        pytest.skip("only part of the module ran")
    seed = wm.DESCRIPTOR.services_by_name["WaymakerStreamsService"]
    served = {m.name for m in seed.methods if not m.name.startswith("Replicate")}
    assert served - RECORDED.called == set()
    unary = {m.name for m in seed.methods if m.name in served and not m.server_streaming}
    assert unary - RECORDED.answered_ok == set()
    assert len(served) == 37
