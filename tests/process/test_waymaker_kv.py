"""Issue 14 items 4 and 5 through the Waymaker API: WaymakerKvService and
WaymakerCollectionsService on a 3-node cluster, driven by a client compiled at test time from the
seed's own proto text (its KV, hash, set and queue messages) with raftlog's two service blocks
appended (the seed names these services but does not define them; the blocks are read from
protos/raftlog/compat/waymaker_{kv,collections}.proto). Every RPC is checked field by field,
with bad input (unknown bucket or store, wrong revision, invalid key, create of a live key, pop
of an empty queue, a full queue), and the same buckets and stores are read through raftlog.v1.

Without the seed document (RAFTLOG_SEEDS_DIR or ../shared/seeds) raftlog's own
waymaker_streams.proto stands in for its text.
"""

from __future__ import annotations

import importlib
import queue
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
from raftlog.v1 import collections_pb2, collections_pb2_grpc, kv_pb2, kv_pb2_grpc
from tests.process.test_waymaker_api import client_proto

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "protos" / "raftlog" / "compat"
SERVICE_BLOCKS = (("waymaker_kv.proto", "waymaker-kv-service"),
                  ("waymaker_collections.proto", "waymaker-collections-service"))
PROTO_STEM = "waymaker_kv_seed"  # the seed text plus our services
MODULE = f"{PROTO_STEM}_pb2"
call_timeout_s = 15.0
ready_timeout_s = 30.0
watch_timeout_s = 10.0
ttl_ms = 600  # longer than a put and a get through another node take
expire_timeout_s = 10.0


# ------------------------------------------------------------------ the seed client

def service_block(proto: Path, marker: str) -> str:
    """The text between `// <marker>-begin` and `// <marker>-end` of one of our .proto files."""
    text = proto.read_text()
    begin, end = f"// {marker}-begin\n", f"// {marker}-end"
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise AssertionError(f"{proto.name} lost its {marker} markers")
    return text[start + len(begin):stop]


def compile_client(out: Path) -> ModuleType:
    """The seed's proto text (raftlog's own waymaker_streams.proto where the seed is absent, see
    test_waymaker_api.client_proto) plus our two services, compiled into `out`, imported with a
    descriptor pool of its own (beside raftlog.compat, which holds the same names)."""
    blocks = "\n".join(service_block(COMPAT / name, marker) for name, marker in SERVICE_BLOCKS)
    (out / f"{PROTO_STEM}.proto").write_text(client_proto()[0] + "\n" + blocks)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                    f"--grpc_python_out={out}", f"{PROTO_STEM}.proto"], check=True, cwd=out,
                   timeout=60)
    generated = out / f"{MODULE}.py"
    text = generated.read_text()
    if "_descriptor_pool.Default()" not in text:
        raise AssertionError("protoc's generated code changed shape; adapt compile_client")
    generated.write_text(text.replace("_descriptor_pool.Default()",
                                      "_descriptor_pool.DescriptorPool()"))
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module(MODULE)
        pb2.grpc = importlib.import_module(f"{MODULE}_grpc")  # one handle for both
        return pb2
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def wm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return compile_client(tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, wm: Any) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("waymaker-kv") / "cluster", nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


class Stubs:
    """Node i's KV and collections stubs of the seed client (`kv(i)`, `col(i)`); each call
    retries UNAVAILABLE (a new stream's primary taking its first lease) for ready_timeout_s."""

    def __init__(self, cluster: LocalCluster, wm: Any) -> None:
        self._cluster, self._wm = cluster, wm

    def kv(self, i: int, method: str, **fields: Any) -> Any:
        stub = self._wm.grpc.WaymakerKvServiceStub(self._cluster.channel(i))
        return self._call(getattr(stub, method), method, fields)

    def col(self, i: int, method: str, **fields: Any) -> Any:
        stub = self._wm.grpc.WaymakerCollectionsServiceStub(self._cluster.channel(i))
        return self._call(getattr(stub, method), method, fields)

    def _call(self, rpc: Callable[..., Any], method: str, fields: dict[str, Any]) -> Any:
        request = getattr(self._wm, REQUESTS.get(method, f"{method}Request"))(**fields)
        answers: list[Any] = []

        def answered() -> bool:
            try:
                answers.append(rpc(request, timeout=call_timeout_s))
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                return False
            return True

        wait_until(answered, ready_timeout_s, interval_s=0.1, what=method)
        return answers[-1]


# Request types whose name is not `<method>Request`.
REQUESTS = {
    "CreateBucket": "KvCreateBucketRequest", "DeleteBucket": "KvDeleteBucketRequest",
    "Put": "KvPutRequest", "Create": "KvCreateRequest", "Update": "KvUpdateRequest",
    "Get": "KvGetRequest", "Delete": "KvDeleteRequest", "Keys": "KvKeysRequest",
    "History": "KvHistoryRequest", "Touch": "KvTouchRequest",
}


@pytest.fixture(scope="module")
def way(cluster: LocalCluster, wm: Any) -> Stubs:
    return Stubs(cluster, wm)


def ok(reply: Any) -> Any:
    assert (reply.success, reply.result_code, reply.message) == (True, "ok", ""), reply
    return reply


def failed(reply: Any, code: str) -> Any:
    assert (reply.success, reply.result_code) == (False, code), reply
    assert reply.message
    return reply


def history(way: Stubs, key: str, **fields: Any) -> list[tuple[bytes, int, bool]]:
    reply = ok(way.kv(2, "History", bucket="wkv", key=key, **fields))
    assert all(entry.ts_ms > 0 for entry in reply.entries)
    return [(entry.value, entry.revision, entry.deleted) for entry in reply.entries]


# ------------------------------------------------------------------ the services

def test_the_services_take_the_seed_messages(wm: Any) -> None:
    """Our compat services and the seed client's agree method for method, and every method
    takes and returns one of the seed's messages (compiling them against its text proves they
    exist; the names here are what the docs list)."""
    from raftlog.compat import waymaker_collections_pb2, waymaker_kv_pb2

    for ours_module, name in ((waymaker_kv_pb2, "WaymakerKvService"),
                              (waymaker_collections_pb2, "WaymakerCollectionsService")):
        ours = ours_module.DESCRIPTOR.services_by_name[name]
        seeds = wm.DESCRIPTOR.services_by_name[name]
        assert ours.full_name == seeds.full_name == f"waymaker.streams.{name}"
        assert [(m.name, m.input_type.full_name, m.output_type.full_name, m.server_streaming)
                for m in ours.methods] == [
            (m.name, m.input_type.full_name, m.output_type.full_name, m.server_streaming)
            for m in seeds.methods]
    kv = wm.DESCRIPTOR.services_by_name["WaymakerKvService"]
    assert [m.name for m in kv.methods] == [
        "CreateBucket", "DeleteBucket", "Put", "Create", "Update", "Get", "Delete", "Keys",
        "History", "Touch", "Watch"]
    assert kv.methods_by_name["Watch"].output_type.name == "KvWatchEvent"
    collections = wm.DESCRIPTOR.services_by_name["WaymakerCollectionsService"]
    assert len(collections.methods) == 22


def test_kv_calls_and_their_result_codes(way: Stubs) -> None:
    ok(way.kv(1, "CreateBucket", bucket="wkv", max_value_size=100, max_age_ms=3_600_000))
    failed(way.kv(2, "CreateBucket", bucket="wkv"), "already_exists")
    failed(way.kv(3, "CreateBucket", bucket="wkv", max_value_size=100, max_age_ms=3_600_000),
           "already_exists")  # also with equal settings
    failed(way.kv(2, "CreateBucket", bucket="bad.name"), "invalid_config")
    before_ms = int(time.time() * 1000)

    r1 = ok(way.kv(2, "Put", bucket="wkv", key="a", value=b"v1")).revision
    got = ok(way.kv(3, "Get", bucket="wkv", key="a"))
    assert got.HasField("entry")
    assert (got.entry.value, got.entry.revision) == (b"v1", r1)
    assert before_ms - 5_000 <= got.entry.ts_ms <= int(time.time() * 1000) + 5_000
    assert failed(way.kv(1, "Create", bucket="wkv", key="a", value=b"x"),
                  "already_exists").revision == r1
    r2 = ok(way.kv(1, "Create", bucket="wkv", key="b", value=b"b1")).revision
    r3 = ok(way.kv(3, "Update", bucket="wkv", key="a", value=b"v2",
                   expected_revision=r1)).revision
    assert r1 < r2 < r3
    assert failed(way.kv(2, "Update", bucket="wkv", key="a", value=b"v3",
                         expected_revision=r1), "wrong_revision").revision == r3
    assert ok(way.kv(1, "Get", bucket="wkv", key="a")).entry.value == b"v2"  # unchanged

    r4 = ok(way.kv(2, "Delete", bucket="wkv", key="b")).revision
    assert r4 > r3
    tombstoned = ok(way.kv(3, "Get", bucket="wkv", key="b"))
    assert not tombstoned.HasField("entry")
    assert not ok(way.kv(3, "Get", bucket="wkv", key="never")).HasField("entry")
    r5 = ok(way.kv(1, "Create", bucket="wkv", key="b", value=b"b2")).revision  # over a tombstone
    assert ok(way.kv(1, "Delete", bucket="wkv", key="b")).revision > r5

    keys = ok(way.kv(1, "Keys", bucket="wkv")).entries
    assert sorted((k.key, k.revision, k.deleted) for k in keys) == [
        ("a", r3, False), ("b", r5 + 1, True)]
    assert history(way, "a") == [(b"v1", r1, False), (b"v2", r3, False)]
    assert history(way, "b") == [(b"b1", r2, False), (b"", r4, True), (b"b2", r5, False),
                                 (b"", r5 + 1, True)]
    assert history(way, "b", from_revision=r4, limit=2) == [(b"", r4, True), (b"b2", r5, False)]
    assert history(way, "never") == []

    r6 = ok(way.kv(3, "Touch", bucket="wkv", key="a", ttl_ms=60_000)).revision
    assert r6 > r5 + 1
    assert (way.kv(2, "Get", bucket="wkv", key="a").entry.value,
            way.kv(2, "Get", bucket="wkv", key="a").entry.revision) == (b"v2", r6)
    failed(way.kv(1, "Touch", bucket="wkv", key="never", ttl_ms=1_000), "no_such_key")

    # A per-key TTL: the value reads as absent once it passes (Get, Keys), Create takes the key.
    short = ok(way.kv(1, "Put", bucket="wkv", key="short", value=b"s", ttl_ms=ttl_ms)).revision
    assert ok(way.kv(2, "Get", bucket="wkv", key="short")).entry.revision == short
    wait_until(lambda: not way.kv(3, "Get", bucket="wkv", key="short").HasField("entry"),
               expire_timeout_s, interval_s=0.1, what="the TTL to pass")
    assert ("short", short, True) in [(k.key, k.revision, k.deleted)
                                      for k in ok(way.kv(1, "Keys", bucket="wkv")).entries]
    assert ok(way.kv(2, "Create", bucket="wkv", key="short", value=b"t")).revision > short

    # Bad input loses nothing.
    for key in ("", "a..b", "sp ace", "a*"):
        failed(way.kv(1, "Put", bucket="wkv", key=key, value=b"x"), "invalid_key")
    failed(way.kv(1, "Get", bucket="wkv", key="a."), "invalid_key")
    failed(way.kv(2, "Put", bucket="wkv", key="big", value=b"x" * 101), "oversize")
    for method, fields in (("Put", {"key": "k", "value": b"x"}), ("Get", {"key": "k"}),
                           ("Delete", {"key": "k"}), ("Keys", {}), ("History", {"key": "k"}),
                           ("Create", {"key": "k"}), ("Update", {"key": "k"}),
                           ("Touch", {"key": "k"}), ("DeleteBucket", {})):
        failed(way.kv(3, method, bucket="nope", **fields), "no_such_bucket")
    assert [(k.key, k.revision) for k in sorted(ok(way.kv(2, "Keys", bucket="wkv")).entries,
                                                 key=lambda k: k.key)][:2] == [("a", r6),
                                                                               ("b", r5 + 1)]

    ok(way.kv(2, "CreateBucket", bucket="wkv-gone", ephemeral=True))
    ok(way.kv(3, "Put", bucket="wkv-gone", key="k", value=b"v"))
    ok(way.kv(1, "DeleteBucket", bucket="wkv-gone"))
    failed(way.kv(2, "Get", bucket="wkv-gone", key="k"), "no_such_bucket")
    failed(way.kv(2, "DeleteBucket", bucket="wkv-gone"), "no_such_bucket")


class Watch:
    """A Watch read on a thread into a queue, cancelled by `close`."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self.events: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                self.events.put(event)
        except grpc.RpcError as err:
            self.events.put(err)

    def next(self) -> Any:
        event = self.events.get(timeout=watch_timeout_s)
        if isinstance(event, grpc.RpcError) and event.code() != grpc.StatusCode.CANCELLED:
            raise AssertionError(f"the watch failed: {event.code()} {event.details()}")
        return event

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=watch_timeout_s)


def as_tuple(event: Any) -> tuple[Any, ...]:
    kind = event.WhichOneof("event")
    body = getattr(event, kind)
    assert body.ts_ms > 0
    return (kind, body.key, body.value if kind == "put" else None, body.revision)


def test_watch_sends_live_values_then_puts_and_deletes(cluster: LocalCluster, way: Stubs,
                                                       wm: Any) -> None:
    ok(way.kv(1, "CreateBucket", bucket="wwatch"))
    x1 = ok(way.kv(2, "Put", bucket="wwatch", key="x", value=b"1")).revision
    y0 = ok(way.kv(2, "Put", bucket="wwatch", key="y", value=b"0")).revision
    stub = wm.grpc.WaymakerKvServiceStub(cluster.channel(3))
    every = Watch(stub.Watch(wm.KvWatchRequest(bucket="wwatch"), timeout=60))
    one = Watch(stub.Watch(wm.KvWatchRequest(bucket="wwatch", key="y"), timeout=60))
    try:
        # The live values first (in revision order): both watches have started.
        assert [as_tuple(every.next()) for _ in range(2)] == [("put", "x", b"1", x1),
                                                              ("put", "y", b"0", y0)]
        assert as_tuple(one.next()) == ("put", "y", b"0", y0)
        y1 = ok(way.kv(1, "Put", bucket="wwatch", key="y", value=b"2")).revision
        x2 = ok(way.kv(2, "Delete", bucket="wwatch", key="x")).revision
        y2 = ok(way.kv(1, "Delete", bucket="wwatch", key="y")).revision
        assert [as_tuple(every.next()) for _ in range(3)] == [
            ("put", "y", b"2", y1), ("delete", "x", None, x2), ("delete", "y", None, y2)]
        assert [as_tuple(one.next()) for _ in range(2)] == [
            ("put", "y", b"2", y1), ("delete", "y", None, y2)]
        assert one.events.empty()  # nothing of x
    finally:
        every.close()
        one.close()
    for request, status in ((wm.KvWatchRequest(bucket="wwatch", key="y.*"),
                             grpc.StatusCode.INVALID_ARGUMENT),
                            (wm.KvWatchRequest(bucket="nope"), grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stub.Watch(request, timeout=call_timeout_s)))
        assert info.value.code() == status


def test_hash_and_set_calls(way: Stubs) -> None:
    ok(way.col(1, "CreateHashStore", name="wh", max_bytes=4096, ephemeral=True))
    failed(way.col(2, "CreateHashStore", name="wh"), "already_exists")
    failed(way.col(3, "CreateHashStore", name="wh", max_bytes=4096, ephemeral=True),
           "already_exists")  # also with equal settings
    failed(way.col(2, "CreateHashStore", name="bad name"), "invalid_config")
    r1 = ok(way.col(2, "HashSet", bucket="wh", hash_key="u1", field="name",
                    value=b"ada")).revision
    r2 = ok(way.col(3, "HashSet", bucket="wh", hash_key="u1", field="lang",
                    value=b"")).revision  # an empty value is a value
    assert 0 < r1 < r2
    got = ok(way.col(1, "HashGet", bucket="wh", hash_key="u1", field="name"))
    assert (got.HasField("value"), got.value, got.revision) == (True, b"ada", r1)
    empty = ok(way.col(1, "HashGet", bucket="wh", hash_key="u1", field="lang"))
    assert (empty.HasField("value"), empty.value, empty.revision) == (True, b"", r2)
    absent = ok(way.col(3, "HashGet", bucket="wh", hash_key="u1", field="nope"))
    assert (absent.HasField("value"), absent.revision) == (False, 0)
    assert ok(way.col(2, "HashExists", bucket="wh", hash_key="u1", field="name")).exists
    assert not ok(way.col(2, "HashExists", bucket="wh", hash_key="u2", field="name")).exists
    entries = ok(way.col(3, "HashGetAll", bucket="wh", hash_key="u1")).entries
    assert sorted((e.field, e.value, e.revision) for e in entries) == [
        ("lang", b"", r2), ("name", b"ada", r1)]
    assert sorted(ok(way.col(1, "HashFields", bucket="wh", hash_key="u1")).fields) == [
        "lang", "name"]
    assert ok(way.col(2, "HashLen", bucket="wh", hash_key="u1")).count == 2
    ok(way.col(3, "HashDelete", bucket="wh", hash_key="u1", field="name"))
    ok(way.col(3, "HashDelete", bucket="wh", hash_key="u1", field="name"))  # absent: still ok
    assert not ok(way.col(1, "HashGet", bucket="wh", hash_key="u1", field="name")).HasField(
        "value")
    assert ok(way.col(2, "HashLen", bucket="wh", hash_key="u1")).count == 1
    assert ok(way.col(2, "HashLen", bucket="wh", hash_key="none")).count == 0
    failed(way.col(1, "HashSet", bucket="wh", hash_key="", field="f", value=b"v"), "invalid_key")
    failed(way.col(1, "HashSet", bucket="wh", hash_key="k", field="f" * 121, value=b"v"),
           "invalid_key")
    failed(way.col(1, "HashSet", bucket="wh", hash_key="k", field="big", value=b"v" * 5000),
           "full")  # past the store's max_bytes
    for method in ("HashSet", "HashGet", "HashExists", "HashDelete"):
        failed(way.col(2, method, bucket="nope", hash_key="k", field="f"), "no_such_bucket")
    for method in ("HashGetAll", "HashFields", "HashLen"):
        failed(way.col(2, method, bucket="nope", hash_key="k"), "no_such_bucket")

    ok(way.col(1, "CreateSetStore", name="ws"))
    failed(way.col(3, "CreateSetStore", name="ws"), "already_exists")
    for member in ("red", "blue", "red"):
        ok(way.col(2, "SetAdd", bucket="ws", set_key="p7", member=member))
    assert sorted(ok(way.col(3, "SetMembers", bucket="ws", set_key="p7")).members) == [
        "blue", "red"]
    assert ok(way.col(1, "SetLen", bucket="ws", set_key="p7")).count == 2
    assert ok(way.col(1, "SetIsMember", bucket="ws", set_key="p7", member="red")).is_member
    ok(way.col(3, "SetRemove", bucket="ws", set_key="p7", member="red"))
    ok(way.col(3, "SetRemove", bucket="ws", set_key="p7", member="green"))  # absent: still ok
    assert not ok(way.col(1, "SetIsMember", bucket="ws", set_key="p7", member="red")).is_member
    assert ok(way.col(2, "SetMembers", bucket="ws", set_key="p7")).members == ["blue"]
    assert ok(way.col(2, "SetLen", bucket="ws", set_key="p7")).count == 1
    failed(way.col(2, "SetAdd", bucket="ws", set_key="p7", member=""), "invalid_key")
    for method in ("SetAdd", "SetRemove", "SetIsMember"):
        failed(way.col(3, method, bucket="nope", set_key="k", member="m"), "no_such_bucket")
    for method in ("SetMembers", "SetLen"):
        failed(way.col(3, method, bucket="nope", set_key="k"), "no_such_bucket")

    ok(way.col(2, "DeleteSetStore", name="ws"))
    failed(way.col(1, "SetLen", bucket="ws", set_key="p7"), "no_such_bucket")
    failed(way.col(1, "DeleteSetStore", name="ws"), "no_such_bucket")
    ok(way.col(3, "DeleteHashStore", name="wh"))
    failed(way.col(3, "DeleteHashStore", name="wh"), "no_such_bucket")


def test_queue_calls(way: Stubs) -> None:
    ok(way.col(1, "CreateQueue", name="wq", max_messages=3))
    failed(way.col(2, "CreateQueue", name="wq"), "already_exists")
    assert not ok(way.col(2, "QueuePop", bucket="wq")).HasField("value")  # empty
    sequences = [ok(way.col(1 + i, "QueuePush", bucket="wq", value=v)).sequence
                 for i, v in enumerate((b"a", b"b", b""))]
    assert sequences == sorted(sequences) and len(set(sequences)) == 3
    failed(way.col(3, "QueuePush", bucket="wq", value=b"d"), "full")
    assert ok(way.col(2, "QueueLen", bucket="wq")).count == 3
    assert ok(way.col(3, "QueueRange", bucket="wq", from_sequence=0, limit=2)).values == [
        b"a", b"b"]
    assert ok(way.col(3, "QueueRange", bucket="wq", from_sequence=sequences[1])).values == [
        b"b", b""]
    popped = ok(way.col(1, "QueuePop", bucket="wq"))
    assert (popped.HasField("value"), popped.value) == (True, b"a")
    assert ok(way.col(2, "QueueLen", bucket="wq")).count == 2
    assert ok(way.col(1, "QueueRange", bucket="wq")).values == [b"b", b""]  # a is gone
    assert ok(way.col(3, "QueuePop", bucket="wq")).value == b"b"
    last = ok(way.col(2, "QueuePop", bucket="wq"))
    assert (last.HasField("value"), last.value) == (True, b"")  # an empty value, not "empty"
    assert not ok(way.col(1, "QueuePop", bucket="wq")).HasField("value")
    assert ok(way.col(1, "QueueLen", bucket="wq")).count == 0
    for method, fields in (("QueuePush", {"value": b"x"}), ("QueuePop", {}),
                           ("QueueRange", {}), ("QueueLen", {})):
        failed(way.col(3, method, bucket="nope", **fields), "no_such_bucket")
    ok(way.col(3, "DeleteQueue", name="wq"))
    failed(way.col(1, "QueuePush", bucket="wq", value=b"x"), "no_such_bucket")
    failed(way.col(1, "DeleteQueue", name="wq"), "no_such_bucket")


def test_the_same_buckets_and_stores_through_both_apis(cluster: LocalCluster,
                                                       way: Stubs) -> None:
    kv = kv_pb2_grpc.KVStub(cluster.channel(1))  # type: ignore[no-untyped-call]
    ok(way.kv(2, "CreateBucket", bucket="both"))
    revision = ok(way.kv(3, "Put", bucket="both", key="k", value=b"from-waymaker")).revision
    entry = kv.Get(kv_pb2.KvGetRequest(bucket="both", key="k"), timeout=call_timeout_s)
    assert (entry.value, entry.revision, entry.operation) == (b"from-waymaker", revision,
                                                             kv_pb2.KV_OPERATION_PUT)
    written = kv.Put(kv_pb2.KvPutRequest(bucket="both", key="j", value=b"from-v1"),
                     timeout=call_timeout_s)
    got = ok(way.kv(2, "Get", bucket="both", key="j"))
    assert (got.entry.value, got.entry.revision) == (b"from-v1", written.revision)
    info = kv.GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(bucket="both"), timeout=call_timeout_s)
    assert (info.stream, info.state.keys) == ("KV_both", 2)

    col = collections_pb2_grpc.CollectionsStub(  # type: ignore[no-untyped-call]
        cluster.channel(2))
    col.CreateCollection(collections_pb2.CreateCollectionRequest(
        kind=collections_pb2.COLLECTION_KIND_HASH, name="both"), timeout=call_timeout_s)
    set_reply = col.SetHashField(collections_pb2.SetHashFieldRequest(
        collection="both", key="u", field="f", value=b"from-v1"), timeout=call_timeout_s)
    got_field = ok(way.col(3, "HashGet", bucket="both", hash_key="u", field="f"))
    assert (got_field.value, got_field.revision) == (b"from-v1", set_reply.revision)
    failed(way.col(1, "CreateHashStore", name="both"), "already_exists")

    ok(way.col(1, "CreateQueue", name="both"))
    pushed = ok(way.col(3, "QueuePush", bucket="both", value=b"job")).sequence
    item = col.PopQueue(collections_pb2.PopQueueRequest(collection="both"),
                        timeout=call_timeout_s)
    assert (item.sequence, item.value) == (pushed, b"job")
    assert not ok(way.col(1, "QueuePop", bucket="both")).HasField("value")
