"""Stream sources (issue 14 item 2) end to end on a real 3-process cluster, over raftlog.v1.

- A sourcing stream whose primary is another node than its source's copies exactly the
  filtered messages from its start seq, transformed, in order; a message the transform does not
  match goes to the dead-letter stream as a JSON record; GetStreamSources (through any node)
  and GetStreamInfo report the tail's node, position, totals and last error.
- Bad input: a source that does not exist yet is accepted and reported ("does not exist")
  until it is created; sourcing from itself and a transform naming a wildcard its pattern lacks
  are refused with INVALID_ARGUMENT / INVALID_CONFIG.
- kill -9 of the sourcing stream's primary, then (once it is back) of the source's primary,
  while a client keeps publishing to the source: the sourcing stream ends with exactly the
  filtered source messages, each once, in source order (compared by the recorded source seqs).
  Its dedupe window is 1 ms, so only the tails' recovered positions keep copies single.
- The Waymaker API (waymaker.streams): a stream created there with a source copies like one of
  raftlog.v1, its config and GetStreamInfo.sources_status show the source, GetStreamSources
  answers "ok" with the tail, and a bad transform is "invalid_config".
- The CLI: `raftlog stream create NAME --source SPEC` and `raftlog stream sources --json`.
- on_drop halt vs skip: the source is purged while the tails are stopped (their node killed);
  the tails the new primary starts find the gap: one halts with a last_error, the other goes on
  from the source's first seq.

One cluster for the module; processes are signalled by pid and stopped at the end.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.compat import waymaker_streams_pb2_grpc as wm_grpc
from raftlog.node.cli.main import main as cli_main
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

T = TypeVar("T")
call_timeout_s = 5.0
copy_timeout_s = 20.0  # published to the source -> copied by the tail
failover_timeout_s = 30.0  # kill -9 of a primary -> its streams copy again
TRANSFORM = types_pb2.SubjectTransform(source_pattern="orders.*.>",
                                       destination="audit.{{wildcard(1)}}.{{Wildcard(2)}}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("sources") / "cluster"
    local = LocalCluster(root, nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


@pytest.fixture(autouse=True)
def _every_node_back(cluster: LocalCluster) -> Iterator[None]:
    """After each test, a node it left killed (it failed half-way) is started again, so the
    next test has its three nodes."""
    yield
    stopped = [i for i in cluster.specs if i not in cluster.running]
    for i in stopped:
        cluster.start(i)
    if stopped:
        cluster.wait_for_leader(failover_timeout_s)


def _any(cluster: LocalCluster, call: Callable[[int], T], *, timeout_s: float = 20.0) -> T:
    """`call(i)` through the running nodes in turn until one answers (UNAVAILABLE, or a call
    cut by a node's kill: the next one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for i in sorted(cluster.running):
            try:
                return call(i)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.CANCELLED):  # its channel closed (kill)
                    raise
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.1)


def _primary(cluster: LocalCluster, stream: str) -> int:
    route = _any(cluster, lambda i: cluster.cluster(i).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s))
    return cluster.index_of(route.primary)


def _names(cluster: LocalCluster, prefix: str, *, primaries: list[int]) -> list[str]:
    """Unused stream names whose ring owner is each of `primaries` in turn."""
    names: list[str] = []
    for k in range(1000):
        name = f"{prefix}{k}"
        if len(names) < len(primaries) and _primary(cluster, name) == primaries[len(names)]:
            names.append(name)
    assert len(names) == len(primaries), f"no names for primaries {primaries}"
    return names


def _create(cluster: LocalCluster, name: str, *sources: types_pb2.StreamSource,
            subjects: tuple[str, ...] = (), dedupe_window_ms: int = 0) -> None:
    config = types_pb2.StreamConfig(name=name, subjects=list(subjects), sources=list(sources),
                                    dedupe_window_ms=dedupe_window_ms)
    _any(cluster, lambda i: cluster.streams(i).CreateStream(
        streams_pb2.CreateStreamRequest(config=config), timeout=call_timeout_s))


def _publish(cluster: LocalCluster, stream: str, subjects: list[str], *, tag: str) -> None:
    entries = [streams_pb2.PublishEntry(subject=s, payload=f"{tag}-{k}".encode(),
                                        msg_id=f"{tag}-{k}") for k, s in enumerate(subjects)]
    reply = _any(cluster, lambda i: cluster.streams(i).PublishBatch(
        streams_pb2.PublishBatchRequest(stream=stream, entries=entries), timeout=call_timeout_s))
    assert reply.failed == 0, reply


def _read_all(cluster: LocalCluster, stream: str) -> list[types_pb2.Message]:
    found: list[types_pb2.Message] = []
    seq = 1
    while True:
        request = streams_pb2.ReadMessagesRequest(stream=stream, from_seq=seq, limit=1000)
        reply = _any(cluster, lambda i, request=request: cluster.streams(i).ReadMessages(
            request, timeout=call_timeout_s))
        found.extend(reply.messages)
        if reply.next_seq > reply.last_seq:
            return found
        seq = reply.next_seq


def _sourced(cluster: LocalCluster, stream: str, source: str) -> list[int]:
    """The source seqs recorded in `stream`'s copies of `source`, in stream order."""
    seqs = []
    for message in _read_all(cluster, stream):
        headers = {h.key: h.value for h in message.headers}
        if headers.get("Raftlog-Source-Stream") == source:
            assert message.msg_id == f"src:{source}:{headers['Raftlog-Source-Seq']}"
            seqs.append(int(headers["Raftlog-Source-Seq"]))
    return seqs


def _tails(cluster: LocalCluster, stream: str, *, via: int | None = None
           ) -> list[types_pb2.SourceStatus]:
    request = streams_pb2.GetStreamSourcesRequest(stream=stream)
    if via is not None:
        return list(cluster.streams(via).GetStreamSources(request, timeout=call_timeout_s).sources)
    return list(_any(cluster, lambda i: cluster.streams(i).GetStreamSources(
        request, timeout=call_timeout_s)).sources)


def _expected(cluster: LocalCluster, source: str, *, prefix: str, start_seq: int = 1
              ) -> list[int]:
    return [m.seq for m in _read_all(cluster, source)
            if m.subject.startswith(prefix) and m.seq >= start_seq]


def _refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = from_rpc_error(caught.value)
    return caught.value.code(), error.reason.name if error else "", caught.value.details() or ""


SUBJECTS = ["orders.eu.a", "orders.us.b", "orders.eu.c.d", "orders.eu"]  # eu.> matches 1st, 3rd


def test_a_cross_node_source_copies_filtered_transformed_messages_and_reports(
        cluster: LocalCluster) -> None:
    source, sourcing, dlq = _names(cluster, "orders-", primaries=[1, 2, 3])
    _create(cluster, source, subjects=("orders.>",))
    _create(cluster, dlq)
    _publish(cluster, source, SUBJECTS * 3, tag="a")  # seqs 1..12
    _create(cluster, sourcing, types_pb2.StreamSource(
        stream=source, filter_subject="orders.eu.>", start_seq=3, subject_transform=TRANSFORM,
        dlq_stream=dlq))
    wait_until(lambda: _sourced(cluster, sourcing, source) == [3, 5, 7, 9, 11], copy_timeout_s,
               interval_s=0.2, what="the first copies")
    _publish(cluster, source, SUBJECTS, tag="b")  # seqs 13..16
    wait_until(lambda: _sourced(cluster, sourcing, source)[-2:] == [13, 15], copy_timeout_s,
               interval_s=0.2, what="the next copies")
    copies = _read_all(cluster, sourcing)
    assert [m.subject for m in copies[:2]] == ["audit.eu.c.d", "audit.eu.a"]
    assert copies[0].payload == b"a-2" and copies[1].payload == b"a-4"
    headers = {h.key: h.value for h in copies[0].headers}
    assert headers["Raftlog-Source-Subject"] == "orders.eu.c.d"
    assert headers["Raftlog-Source-Msg-Id"] == "a-2" and int(headers["Raftlog-Source-Ts-Ms"]) > 0

    # A message inside the filter that the transform's pattern does not match: dead-lettered.
    other = _names(cluster, "mismatch-", primaries=[2])[0]
    _create(cluster, other, types_pb2.StreamSource(
        stream=source, dlq_stream=dlq, subject_transform=types_pb2.SubjectTransform(
            source_pattern="orders.*.*", destination="x.{{wildcard(2)}}")))
    wait_until(lambda: any(m.subject.endswith(".transform_mismatch")
                           for m in _read_all(cluster, dlq)), copy_timeout_s, interval_s=0.2,
               what="the dead-letter record")
    records = [json.loads(m.payload) for m in _read_all(cluster, dlq)]
    assert {r["subject"] for r in records} == {"orders.eu.c.d", "orders.eu"}
    assert all(r["sourcing_stream"] == other and r["kind"] == "transform_mismatch"
               for r in records)

    # Every node reports every tail, and the stream's info its own.
    for via in (1, 2, 3):
        (tail,) = _tails(cluster, sourcing, via=via)
        assert (tail.source_stream, cluster.index_of(tail.node)) == (source, 2)
        assert (tail.last_sourced_seq, tail.next_seq, tail.source_last_seq) == (15, 17, 16)
        assert (tail.pulled_total, tail.appended_total, tail.last_error) == (7, 7, "")
    (mismatch,) = _tails(cluster, other)
    assert "does not match" in mismatch.last_error and mismatch.last_error_ts_ms > 0
    info = _any(cluster, lambda i: cluster.streams(i).GetStreamInfo(
        streams_pb2.GetStreamInfoRequest(name=sourcing), timeout=call_timeout_s))
    assert [s.last_sourced_seq for s in info.sources] == [15]
    assert info.config.sources[0].subject_transform == TRANSFORM


def test_bad_sources_are_refused_and_a_missing_one_is_reported(cluster: LocalCluster) -> None:
    streams = cluster.streams(1)
    code, reason, text = _refused(lambda: streams.CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="selfish", sources=[
            types_pb2.StreamSource(stream="selfish")])), timeout=call_timeout_s))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_CONFIG.name)
    assert "cannot source from itself" in text
    code, reason, text = _refused(lambda: streams.CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="badtransform", sources=[types_pb2.StreamSource(
            stream="x", subject_transform=types_pb2.SubjectTransform(
                source_pattern="a.*", destination="b.{{wildcard(2)}}"))])),
        timeout=call_timeout_s))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_CONFIG.name)
    assert "refers to wildcard 2" in text
    for name in ("selfish", "badtransform"):  # nothing was created
        code, reason, _ = _refused(lambda name=name: streams.GetStreamInfo(
            streams_pb2.GetStreamInfoRequest(name=name), timeout=call_timeout_s))
        assert reason == Reason.STREAM_NOT_FOUND.name

    _create(cluster, "waiting", types_pb2.StreamSource(stream="later"))
    wait_until(lambda: [t.last_error for t in _tails(cluster, "waiting")]
               == ["source stream 'later' does not exist"], copy_timeout_s, interval_s=0.2,
               what="the missing source reported")
    _create(cluster, "later")
    _publish(cluster, "later", ["x", "y"], tag="later")
    wait_until(lambda: _sourced(cluster, "waiting", "later") == [1, 2], copy_timeout_s,
               interval_s=0.2, what="the copies once the source exists")
    wait_until(lambda: [t.last_error for t in _tails(cluster, "waiting")] == [""],
               copy_timeout_s, interval_s=0.2, what="the error cleared")


class Publisher(threading.Thread):
    """Publishes `orders.eu.N` / `orders.us.N` to a stream until stopped, each message retried
    (same msg_id) through the next node until it is acknowledged."""

    def __init__(self, cluster: LocalCluster, stream: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.stream = cluster, stream
        self.stopping = threading.Event()
        self.acked = 0

    def _publish(self, request: streams_pb2.PublishRequest, i: int) -> None:
        self.cluster.streams(i).Publish(request, timeout=2.0)

    def run(self) -> None:
        k = 0
        while not self.stopping.is_set():
            request = streams_pb2.PublishRequest(
                stream=self.stream, subject=f"orders.{'eu' if k % 2 else 'us'}.{k}",
                payload=b"%d" % k, msg_id=f"p-{k}")
            _any(self.cluster, functools.partial(self._publish, request),
                 timeout_s=failover_timeout_s)
            self.acked += 1
            k += 1
            time.sleep(0.01)


def _running_except(cluster: LocalCluster, index: int) -> int:
    return min(i for i in cluster.running if i != index)


def test_tails_survive_kill9_of_either_side_without_gap_or_duplicate(
        cluster: LocalCluster) -> None:
    source, sourcing = _names(cluster, "flow-", primaries=[1, 3])
    _create(cluster, source, subjects=("orders.>",))
    # A dedupe window of 1 ms: no second copy is absorbed, the tails' positions alone decide.
    _create(cluster, sourcing, types_pb2.StreamSource(stream=source, filter_subject="orders.eu.>"),
            dedupe_window_ms=1)
    publisher = Publisher(cluster, source)
    publisher.start()
    try:
        wait_until(lambda: len(_sourced(cluster, sourcing, source)) >= 20, copy_timeout_s,
                   interval_s=0.2, what="copies before the first kill")
        cluster.kill9(3)  # the sourcing stream's primary
        wait_until(lambda: _primary(cluster, sourcing) != 3, failover_timeout_s,
                   interval_s=0.2, what="the sourcing stream's failover")
        count = len(_sourced(cluster, sourcing, source))
        wait_until(lambda: len(_sourced(cluster, sourcing, source)) >= count + 20,
                   failover_timeout_s, interval_s=0.2, what="copies after the first failover")
        cluster.restart(3)
        cluster.wait_for_leader(failover_timeout_s)
        source_primary = _primary(cluster, source)
        cluster.kill9(source_primary)
        wait_until(lambda: _primary(cluster, source) != source_primary, failover_timeout_s,
                   interval_s=0.2, what="the source's failover")
        count = len(_sourced(cluster, sourcing, source))
        wait_until(lambda: len(_sourced(cluster, sourcing, source)) >= count + 20,
                   failover_timeout_s, interval_s=0.2, what="copies after the second failover")
        cluster.restart(source_primary)
    finally:
        publisher.stopping.set()
        publisher.join(failover_timeout_s)
    expected = _expected(cluster, source, prefix="orders.eu.")
    assert len(expected) >= 60 and publisher.acked >= 120
    wait_until(lambda: _sourced(cluster, sourcing, source) == expected, copy_timeout_s,
               interval_s=0.2, what="every filtered source message copied once, in order")
    (tail,) = _tails(cluster, sourcing)
    assert tail.last_sourced_seq == expected[-1] and tail.last_error == ""


def test_on_drop_halt_and_skip_after_the_source_removed_unread_messages(
        cluster: LocalCluster) -> None:
    source, halting, skipping = _names(cluster, "drop-", primaries=[1, 2, 2])
    _create(cluster, source)
    _create(cluster, halting, types_pb2.StreamSource(stream=source))
    _create(cluster, skipping, types_pb2.StreamSource(
        stream=source, on_drop=types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE))
    _publish(cluster, source, ["a"] * 5, tag="first")
    for name in (halting, skipping):
        wait_until(lambda name=name: _sourced(cluster, name, source) == [1, 2, 3, 4, 5],
                   copy_timeout_s, interval_s=0.2, what="the first copies")
    cluster.kill9(2)  # both tails stop with their node
    _publish(cluster, source, ["b"] * 5, tag="second")  # seqs 6..10
    _any(cluster, lambda i: cluster.streams(i).PurgeStream(
        streams_pb2.PurgeStreamRequest(name=source, below_seq=8), timeout=call_timeout_s))
    listed = cluster.streams(1).GetStreamSources(streams_pb2.GetStreamSourcesRequest(),
                                                 timeout=call_timeout_s)
    assert list(listed.unreachable) == ["n2"]
    wait_until(lambda: _sourced(cluster, skipping, source) == [1, 2, 3, 4, 5, 8, 9, 10],
               failover_timeout_s, interval_s=0.2, what="the skipping tail past the gap")
    wait_until(lambda: [t.halted for t in _tails(cluster, halting)] == [True],
               failover_timeout_s, interval_s=0.2, what="the halting tail halted")
    (halted,) = _tails(cluster, halting)
    assert "removed seqs 6..7" in halted.last_error and "halted" in halted.last_error
    assert _sourced(cluster, halting, source) == [1, 2, 3, 4, 5]
    (skipped,) = _tails(cluster, skipping)
    assert not skipped.halted
    cluster.restart(2)
    cluster.wait_for_leader(failover_timeout_s)


def _way(cluster: LocalCluster, call: Callable[[wm_grpc.WaymakerStreamsServiceStub], T]) -> T:
    """A Waymaker call through the running nodes in turn (as `_any`)."""
    return _any(cluster, lambda i: call(wm_grpc.WaymakerStreamsServiceStub(cluster.channel(i))))


def test_sources_through_the_waymaker_api(cluster: LocalCluster) -> None:
    source, sourcing = _names(cluster, "wm-", primaries=[3, 1])
    assert _way(cluster, lambda way: way.CreateStream(wm.CreateStreamRequest(
        config=wm.StreamConfigPb(name=source, subjects_filter=["orders.>"])),
        timeout=call_timeout_s)).success
    _publish(cluster, source, SUBJECTS, tag="wm")
    wanted = wm.StreamSourceConfigPb(
        source_stream=source, filter_subject="orders.eu.>", start_seq=1,
        subject_transform=wm.SubjectTransformPb(source_pattern=TRANSFORM.source_pattern,
                                                destination=TRANSFORM.destination),
        max_initial_backfill=100, on_drop=wm.ON_DROP_SKIP_TO_FIRST_AVAILABLE)
    created = _way(cluster, lambda way: way.CreateStream(wm.CreateStreamRequest(
        config=wm.StreamConfigPb(name=sourcing, sources=[wanted])), timeout=call_timeout_s))
    assert (created.success, created.result_code) == (True, "ok"), created
    wait_until(lambda: _sourced(cluster, sourcing, source) == [1, 3], copy_timeout_s,
               interval_s=0.2, what="the copies")
    info = _way(cluster, lambda way: way.GetStreamInfo(wm.GetStreamInfoRequest(name=sourcing),
                                                       timeout=call_timeout_s))
    assert list(info.config.sources) == [wanted]
    assert [(s.source_stream, s.last_sourced_seq, s.pulled_total, s.last_error)
            for s in info.sources_status] == [(source, 3, 2, "")]
    listed = _way(cluster, lambda way: way.GetStreamSources(wm.GetStreamSourcesRequest(),
                                                            timeout=call_timeout_s))
    assert (listed.success, listed.result_code) == (True, "ok")
    assert [(e.source_stream, e.last_sourced_seq) for e in listed.entries
            if e.sourcing_stream == sourcing] == [(source, 3)]
    # raftlog.v1 sees the same stream and source.
    v1 = _any(cluster, lambda i: cluster.streams(i).GetStreamInfo(
        streams_pb2.GetStreamInfoRequest(name=sourcing), timeout=call_timeout_s))
    assert v1.config.sources[0].on_drop == types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE
    request = wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="wm-bad", sources=[wm.StreamSourceConfigPb(
            source_stream=source, subject_transform=wm.SubjectTransformPb(
                source_pattern="orders.*", destination="x.{{wildcard(3)}}"))]))
    bad = _way(cluster, lambda way: way.CreateStream(request, timeout=call_timeout_s))
    assert (bad.success, bad.result_code) == (False, "invalid_config")
    assert "refers to wildcard 3" in bad.message


def test_the_cli_creates_a_sourcing_stream_and_lists_its_tail(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    source, sourcing = _names(cluster, "cli-", primaries=[1, 2])
    _create(cluster, source)
    _publish(cluster, source, ["a.x", "b.x", "a.y"], tag="cli")
    server = ["--server", cluster.address(3)]
    assert cli_main([*server, "stream", "create", sourcing, "--source",
                     f"{source},filter=a.*,transform=a.*=>copied.{{{{wildcard(1)}}}}"]) == 0
    wait_until(lambda: _sourced(cluster, sourcing, source) == [1, 3], copy_timeout_s,
               interval_s=0.2, what="the copies")
    capsys.readouterr()
    assert cli_main([*server, "stream", "sources", sourcing, "--json"]) == 0
    (tail,) = json.loads(capsys.readouterr().out)["sources"]
    assert (tail["source_stream"], tail["last_sourced_seq"], tail["node"]) == (source, 3, "n2")
    assert [m.subject for m in _read_all(cluster, sourcing)] == ["copied.x", "copied.y"]
    assert cli_main([*server, "stream", "create", "cli-bad", "--source", "x,backfill=-1"]) == 2
    assert "whole number" in capsys.readouterr().err
