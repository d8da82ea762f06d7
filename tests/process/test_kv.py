"""KV buckets end to end on a real 3-process cluster (one cluster for the module): every KV call
through gRPC, sent to different nodes than the bucket's primary, bad input, watches of every key
and of one key, TTLs, the history limit, max bytes, the CLI, and revisions that survive a kill -9
of the bucket stream's primary, with a watch that goes on through it (last: it restarts the
killed node).

Processes are signalled by pid through LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import cluster_pb2, kv_pb2, kv_pb2_grpc

call_timeout_s = 10.0
ttl_ms = 600  # short, but longer than a put and a get through another node take
expire_timeout_s = 10.0
watch_timeout_s = 10.0
failover_timeout_s = 30.0
cli_timeout_s = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("kv") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def kv(cluster: LocalCluster, i: int) -> Any:
    return kv_pb2_grpc.KVStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def expect_error(call: Any, request: object, reason: Reason) -> dict[str, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=call_timeout_s)
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, info.value.details()
    return err.metadata


def add_bucket(cluster: LocalCluster, bucket: str, **fields: Any) -> kv_pb2.KvBucketInfo:
    """Created through node 1 (retried while the cluster is still settling)."""
    found: list[kv_pb2.KvBucketInfo] = []

    def created() -> bool:
        try:
            found.append(kv(cluster, 1).CreateBucket(kv_pb2.KvCreateBucketRequest(
                config=kv_pb2.KvBucketConfig(bucket=bucket, **fields)), timeout=call_timeout_s))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    def serving() -> bool:  # a new stream's primary serves once its replicas answered
        try:
            kv(cluster, 1).GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(bucket=bucket),
                                         timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, 15, interval_s=0.1, what=f"bucket {bucket} created")
    wait_until(serving, 15, interval_s=0.05, what=f"bucket {bucket} serving")
    return found[0]


def put(cluster: LocalCluster, i: int, bucket: str, key: str, value: bytes, **fields: Any
        ) -> int:
    response = kv(cluster, i).Put(kv_pb2.KvPutRequest(bucket=bucket, key=key, value=value,
                                                      **fields), timeout=call_timeout_s)
    return int(response.revision)


def get(cluster: LocalCluster, i: int, bucket: str, key: str, revision: int = 0
        ) -> kv_pb2.KvEntry:
    entry: kv_pb2.KvEntry = kv(cluster, i).Get(kv_pb2.KvGetRequest(
        bucket=bucket, key=key, revision=revision), timeout=call_timeout_s)
    return entry


def is_gone(cluster: LocalCluster, i: int, bucket: str, key: str) -> bool:
    try:
        get(cluster, i, bucket, key)
    except grpc.RpcError as err:
        found = from_rpc_error(err)
        return found is not None and found.reason is Reason.KEY_NOT_FOUND
    return False


def primary_of(cluster: LocalCluster, bucket: str) -> int:
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
        stream=f"KV_{bucket}"), timeout=call_timeout_s)
    return cluster.index_of(route.primary)


def others(primary: int) -> list[int]:
    return [i for i in (1, 2, 3) if i != primary]


class Watcher:
    """A Watch call read on a thread; its events in a list."""

    def __init__(self, cluster: LocalCluster, i: int, request: kv_pb2.KvWatchRequest) -> None:
        self.events: list[kv_pb2.KvWatchEvent] = []
        self.error: grpc.RpcError | None = None
        self._lock = threading.Lock()
        self._call = kv(cluster, i).Watch(request)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._call:
                with self._lock:
                    self.events.append(event)
        except grpc.RpcError as err:
            self.error = err

    def entries(self) -> list[tuple[int, str, int, bytes]]:
        """(operation, key, revision, value) of every entry event so far."""
        with self._lock:
            return [(e.entry.operation, e.entry.key, e.entry.revision, e.entry.value)
                    for e in self.events if e.HasField("entry")]

    def caught_up(self) -> bool:
        with self._lock:
            return any(e.HasField("caught_up") for e in self.events)

    def wait(self, count: int, what: str) -> list[tuple[int, str, int, bytes]]:
        deadline = time.monotonic() + watch_timeout_s
        while len(self.entries()) < count and self.error is None:
            assert time.monotonic() < deadline, f"{what}: only {self.entries()}"
            time.sleep(0.02)
        assert self.error is None, self.error
        return self.entries()

    def stop(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=watch_timeout_s)


PUT, DEL, PURGE, EXPIRED = (kv_pb2.KV_OPERATION_PUT, kv_pb2.KV_OPERATION_DELETE,
                            kv_pb2.KV_OPERATION_PURGE, kv_pb2.KV_OPERATION_EXPIRED)


def test_every_operation_through_other_nodes(cluster: LocalCluster) -> None:
    info = add_bucket(cluster, "cfg", history=5, description="settings")
    assert (info.stream, info.config.history, info.config.description) == ("KV_cfg", 5,
                                                                          "settings")
    primary = primary_of(cluster, "cfg")
    a, b = others(primary)
    one = put(cluster, a, "cfg", "db.host", b"h1")
    entry = get(cluster, b, "cfg", "db.host")
    assert (entry.value, entry.revision, entry.operation) == (b"h1", one, PUT)
    # Create only when absent; Update only at the current revision.
    meta = expect_error(kv(cluster, b).Create, kv_pb2.KvCreateRequest(
        bucket="cfg", key="db.host", value=b"x"), Reason.KEY_EXISTS)
    assert meta["revision"] == str(one)
    meta = expect_error(kv(cluster, a).Update, kv_pb2.KvUpdateRequest(
        bucket="cfg", key="db.host", value=b"x", revision=one + 100), Reason.WRONG_REVISION)
    assert meta["revision"] == str(one)
    two = kv(cluster, a).Update(kv_pb2.KvUpdateRequest(
        bucket="cfg", key="db.host", value=b"h2", revision=one), timeout=call_timeout_s).revision
    assert two > one and get(cluster, primary, "cfg", "db.host").value == b"h2"
    # Delete: the key reads as absent, its history stays, Create works again.
    gone = kv(cluster, b).Delete(kv_pb2.KvDeleteRequest(bucket="cfg", key="db.host"),
                                 timeout=call_timeout_s).revision
    meta = expect_error(kv(cluster, a).Get, kv_pb2.KvGetRequest(bucket="cfg", key="db.host"),
                        Reason.KEY_NOT_FOUND)
    assert meta["revision"] == str(gone)
    assert get(cluster, a, "cfg", "db.host", revision=one).value == b"h1"
    expect_error(kv(cluster, a).Get, kv_pb2.KvGetRequest(bucket="cfg", key="db.host",
                                                         revision=gone), Reason.KEY_NOT_FOUND)
    three = kv(cluster, b).Create(kv_pb2.KvCreateRequest(bucket="cfg", key="db.host",
                                                         value=b"h3"),
                                  timeout=call_timeout_s).revision
    history = kv(cluster, a).History(kv_pb2.KvHistoryRequest(bucket="cfg", key="db.host"),
                                     timeout=call_timeout_s)
    assert [(e.operation, e.revision, e.value) for e in history.entries] == [
        (PUT, one, b"h1"), (PUT, two, b"h2"), (DEL, gone, b""), (PUT, three, b"h3")]
    # Keys: live ones by default, every one with include_deleted; patterns.
    put(cluster, a, "cfg", "db.port", b"5432")
    put(cluster, b, "cfg", "web.port", b"80")
    kv(cluster, a).Delete(kv_pb2.KvDeleteRequest(bucket="cfg", key="web.port"),
                          timeout=call_timeout_s)
    keys = kv(cluster, b).Keys(kv_pb2.KvKeysRequest(bucket="cfg"), timeout=call_timeout_s)
    assert [k.key for k in keys.keys] == ["db.host", "db.port"]
    keys = kv(cluster, b).Keys(kv_pb2.KvKeysRequest(bucket="cfg", include_deleted=True),
                               timeout=call_timeout_s)
    assert [(k.key, k.deleted) for k in keys.keys] == [
        ("db.host", False), ("db.port", False), ("web.port", True)]
    keys = kv(cluster, a).Keys(kv_pb2.KvKeysRequest(bucket="cfg", filter="*.port",
                                                    include_deleted=True),
                               timeout=call_timeout_s)
    assert [k.key for k in keys.keys] == ["db.port", "web.port"]
    # Touch writes the value again (a new revision); Purge drops the history.
    touched = kv(cluster, a).Touch(kv_pb2.KvTouchRequest(bucket="cfg", key="db.port",
                                                         ttl_ms=3_600_000),
                                   timeout=call_timeout_s)
    entry = get(cluster, b, "cfg", "db.port")
    assert (entry.value, entry.revision, entry.expires_ms) == (b"5432", touched.revision,
                                                               touched.expires_ms)
    purged = kv(cluster, b).Purge(kv_pb2.KvPurgeRequest(bucket="cfg", key="db.host"),
                                  timeout=call_timeout_s)
    assert purged.purged == 4
    history = kv(cluster, a).History(kv_pb2.KvHistoryRequest(bucket="cfg", key="db.host"),
                                     timeout=call_timeout_s)
    assert [(e.operation, e.revision) for e in history.entries] == [(PURGE, purged.revision)]
    # Bucket info and list, from any node.
    info = kv(cluster, b).GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(bucket="cfg"),
                                        timeout=call_timeout_s)
    assert info.state.last_revision == purged.revision and info.state.keys == 3
    listed = kv(cluster, a).ListBuckets(kv_pb2.KvListBucketsRequest(), timeout=call_timeout_s)
    assert "cfg" in [bucket.config.bucket for bucket in listed.buckets]


def test_bad_input(cluster: LocalCluster) -> None:
    add_bucket(cluster, "small", max_value_size=100)
    stub = kv(cluster, 2)
    for call, request in (
        (stub.Put, kv_pb2.KvPutRequest(bucket="nobucket", key="k", value=b"v")),
        (stub.Get, kv_pb2.KvGetRequest(bucket="nobucket", key="k")),
        (stub.Keys, kv_pb2.KvKeysRequest(bucket="nobucket")),
        (stub.GetBucketInfo, kv_pb2.KvGetBucketInfoRequest(bucket="nobucket")),
        (stub.DeleteBucket, kv_pb2.KvDeleteBucketRequest(bucket="nobucket")),
    ):
        assert expect_error(call, request, Reason.BUCKET_NOT_FOUND)["bucket"] == "nobucket"
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Watch(kv_pb2.KvWatchRequest(bucket="nobucket"),
                             timeout=call_timeout_s)))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    for key in ("", "a..b", ".a", "a.", "sp ace", "ü", "a*", "x" * 300):
        expect_error(stub.Put, kv_pb2.KvPutRequest(bucket="small", key=key, value=b"v"),
                     Reason.INVALID_KEY)
    expect_error(stub.Keys, kv_pb2.KvKeysRequest(bucket="small", filter="a.>.b"),
                 Reason.INVALID_KEY)
    meta = expect_error(stub.Put, kv_pb2.KvPutRequest(bucket="small", key="k", value=b"v" * 101),
                        Reason.VALUE_TOO_LARGE)
    assert meta["limit"] == "100"
    put(cluster, 3, "small", "k", b"v" * 100)
    expect_error(stub.Create, kv_pb2.KvCreateRequest(bucket="small", key="k", value=b"v"),
                 Reason.KEY_EXISTS)
    expect_error(stub.Update, kv_pb2.KvUpdateRequest(bucket="small", key="fresh", value=b"v",
                                                     revision=1), Reason.WRONG_REVISION)
    expect_error(stub.CreateBucket, kv_pb2.KvCreateBucketRequest(config=kv_pb2.KvBucketConfig(
        bucket="small")), Reason.BUCKET_EXISTS)
    again = stub.CreateBucket(kv_pb2.KvCreateBucketRequest(config=kv_pb2.KvBucketConfig(
        bucket="small", max_value_size=100)), timeout=10)  # the same settings: succeeds
    assert again.config.max_value_size == 100
    expect_error(stub.CreateBucket, kv_pb2.KvCreateBucketRequest(config=kv_pb2.KvBucketConfig(
        bucket="deep", history=limits.kv_history_max + 1)), Reason.INVALID_CONFIG)
    expect_error(stub.CreateBucket, kv_pb2.KvCreateBucketRequest(config=kv_pb2.KvBucketConfig(
        bucket="bad.name")), Reason.INVALID_NAME)
    expect_error(stub.Touch, kv_pb2.KvTouchRequest(bucket="small", key="never", ttl_ms=1000),
                 Reason.KEY_NOT_FOUND)
    revision = get(cluster, 1, "small", "k").revision
    expect_error(stub.Get, kv_pb2.KvGetRequest(bucket="small", key="other", revision=revision),
                 Reason.KEY_NOT_FOUND)  # that revision is another key's
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Watch(kv_pb2.KvWatchRequest(bucket="small", include_history=True,
                                                   updates_only=True), timeout=call_timeout_s)))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Nothing of that changed the bucket: one value, at its revision.
    keys = stub.Keys(kv_pb2.KvKeysRequest(bucket="small", include_deleted=True),
                     timeout=call_timeout_s)
    assert [k.key for k in keys.keys] == ["k"]


def test_history_limit_and_max_bytes(cluster: LocalCluster) -> None:
    add_bucket(cluster, "hist", history=3)
    revisions = [put(cluster, 2, "hist", "k", b"v%d" % n) for n in range(6)]
    history = kv(cluster, 3).History(kv_pb2.KvHistoryRequest(bucket="hist", key="k"),
                                     timeout=call_timeout_s)
    assert [e.revision for e in history.entries] == revisions[-3:]
    max_bytes = 4096
    add_bucket(cluster, "capped", max_bytes=max_bytes)
    for n in range(40):
        put(cluster, 1 + n % 3, "capped", f"k{n}", b"x" * 200)
    info = kv(cluster, 2).GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(bucket="capped"),
                                        timeout=call_timeout_s)
    assert 0 < info.state.bytes <= max_bytes and info.state.last_revision == 40
    assert get(cluster, 1, "capped", "k39").value == b"x" * 200
    assert is_gone(cluster, 1, "capped", "k0")  # the oldest went first


def test_ttl_expiry_touch_and_bucket_max_age(cluster: LocalCluster) -> None:
    add_bucket(cluster, "ttl")
    watcher = Watcher(cluster, 3, kv_pb2.KvWatchRequest(bucket="ttl", updates_only=True))
    try:
        wait_until(watcher.caught_up, watch_timeout_s, what="watch started")
        revision = put(cluster, 1, "ttl", "session", b"s", ttl_ms=ttl_ms)
        put(cluster, 1, "ttl", "forever", b"f")
        assert get(cluster, 2, "ttl", "session").expires_ms > 0
        wait_until(lambda: is_gone(cluster, 2, "ttl", "session"), expire_timeout_s,
                   what="the value with a TTL expired")
        assert not is_gone(cluster, 2, "ttl", "forever")
        keys = kv(cluster, 2).Keys(kv_pb2.KvKeysRequest(bucket="ttl"), timeout=call_timeout_s)
        assert [k.key for k in keys.keys] == ["forever"]
        events = watcher.wait(3, "the expiry seen by the watch")
        assert (EXPIRED, "session", revision, b"") in events
        # Create takes an expired key; Touch keeps a value alive past its first TTL.
        kv(cluster, 1).Create(kv_pb2.KvCreateRequest(bucket="ttl", key="session", value=b"s2",
                                                     ttl_ms=ttl_ms), timeout=call_timeout_s)
        kv(cluster, 2).Touch(kv_pb2.KvTouchRequest(bucket="ttl", key="session",
                                                   ttl_ms=60_000), timeout=call_timeout_s)
        time.sleep(2 * ttl_ms / 1000)  # past the first TTL: nothing to poll for
        assert get(cluster, 3, "ttl", "session").value == b"s2"
    finally:
        watcher.stop()
    add_bucket(cluster, "aging", max_age_ms=500)
    put(cluster, 1, "aging", "k", b"v")
    wait_until(lambda: kv(cluster, 2).GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(
        bucket="aging"), timeout=call_timeout_s).state.entries == 0, expire_timeout_s,
        what="the bucket's max age removed the value")


def test_watch_all_keys_and_one_key(cluster: LocalCluster) -> None:
    add_bucket(cluster, "w", history=10)  # a revision replaced before a watch read it is
    # skipped when the history limit removed it (docs/kv.md): keep them all here
    first = put(cluster, 1, "w", "a", b"a1")
    put(cluster, 1, "w", "b", b"b1")
    everything = Watcher(cluster, 2, kv_pb2.KvWatchRequest(bucket="w"))
    one = Watcher(cluster, 3, kv_pb2.KvWatchRequest(bucket="w", key="a"))
    history = Watcher(cluster, 1, kv_pb2.KvWatchRequest(bucket="w", key="a",
                                                        include_history=True))
    try:
        wait_until(lambda: everything.caught_up() and one.caught_up() and history.caught_up(),
                   watch_timeout_s, what="watches started")
        a2 = put(cluster, 2, "w", "a", b"a2")
        c1 = put(cluster, 3, "w", "c", b"c1")
        deleted = kv(cluster, 1).Delete(kv_pb2.KvDeleteRequest(bucket="w", key="a"),
                                        timeout=call_timeout_s).revision
        all_events = everything.wait(5, "every key's events")
        assert [(op, key, value) for op, key, _, value in all_events] == [
            (PUT, "a", b"a1"), (PUT, "b", b"b1"), (PUT, "a", b"a2"), (PUT, "c", b"c1"),
            (DEL, "a", b"")]
        assert [revision for _, _, revision, _ in all_events][2:] == [a2, c1, deleted]
        assert one.wait(3, "one key's events") == [
            (PUT, "a", first, b"a1"), (PUT, "a", a2, b"a2"), (DEL, "a", deleted, b"")]
        assert [revision for _, _, revision, _ in history.wait(3, "history")] == [
            first, a2, deleted]
    finally:
        for watcher in (everything, one, history):
            watcher.stop()


def test_cli(cluster: LocalCluster, tmp_path: Path) -> None:
    add_bucket(cluster, "cli")
    env = {**os.environ, "RAFTLOG_SERVER": cluster.address(2)}

    def raftlog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raftlog.node.cli", *args],
                              capture_output=True, text=True, timeout=cli_timeout_s, env=env,
                              cwd=tmp_path)

    written = raftlog("kv", "put", "cli", "greeting", "hello", "--json")
    assert written.returncode == 0, written.stderr
    revision = json.loads(written.stdout)["revision"]
    read = raftlog("kv", "get", "cli", "greeting", "--json")
    assert read.returncode == 0, read.stderr
    assert (json.loads(read.stdout)["value_text"], json.loads(read.stdout)["revision"]) == (
        "hello", revision)
    stale = raftlog("kv", "update", "cli", "greeting", "bye", "--revision", str(revision + 5))
    assert stale.returncode == 1 and "WRONG_REVISION" in stale.stderr, stale.stderr


def test_revisions_survive_a_kill_of_the_primary(cluster: LocalCluster) -> None:
    add_bucket(cluster, "durable", history=10, replicas=3)
    revisions = {f"k{n}": put(cluster, 1 + n % 3, "durable", f"k{n}", b"v%d" % n)
                 for n in range(10)}
    primary = primary_of(cluster, "durable")
    survivor = others(primary)[0]
    watcher = Watcher(cluster, survivor, kv_pb2.KvWatchRequest(bucket="durable",
                                                               updates_only=True))
    wait_until(watcher.caught_up, watch_timeout_s, what="watch started")
    cluster.kill9(primary)
    try:
        written: list[int] = []

        def wrote() -> bool:
            try:
                written.append(put(cluster, survivor, "durable", "after", b"x"))
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                return False
            return True

        wait_until(wrote, failover_timeout_s, interval_s=0.1, what="a put after the kill")
        assert written[0] > max(revisions.values())
        for key, revision in revisions.items():
            entry = get(cluster, survivor, "durable", key)
            assert (entry.revision, entry.value) == (revision, b"v" + key[1:].encode())
        updated = kv(cluster, survivor).Update(kv_pb2.KvUpdateRequest(
            bucket="durable", key="k3", value=b"new", revision=revisions["k3"]),
            timeout=call_timeout_s)
        assert updated.revision > written[0]
        # The watch went on through the failover, from the revision it had reached.
        last = (PUT, "k3", updated.revision, b"new")
        wait_until(lambda: last in watcher.entries() or watcher.error is not None,
                   watch_timeout_s, what="the watch after the failover")
        assert watcher.error is None and watcher.entries()[-1] == last
        assert (PUT, "after", written[0], b"x") in watcher.entries()
    finally:
        watcher.stop()
        cluster.start(primary)
