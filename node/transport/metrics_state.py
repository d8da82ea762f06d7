"""The metrics read at scrape time from what a node keeps anyway (docs/metrics.md): streams and
their commit seqs, replication progress, consumers, the Raft group, fsyncs and failovers.

Nothing here counts on a hot path. The state belongs to the node's event loop, so a scrape (on
the HTTP listener's thread) asks the loop for a snapshot and waits at most
limits.metrics_snapshot_timeout_s; when the loop is busy past that, the scrape answers without
these families and with `raftlog_metrics_state_ok 0` (the process metrics still come).

The node's objects are seen through the small protocols below, so this module imports no
layer above transport and a test can hand it plain objects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftlog.base import limits
from raftlog.base.errors import RaftlogError

log = logging.getLogger(__name__)

ROLE_PRIMARY = "primary"  # node/engine/stream_core.py's role of a stream's primary


class StreamView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def deposed(self) -> object | None: ...
    @property
    def last_seq(self) -> int: ...
    @property
    def commit_seq(self) -> int: ...
    @property
    def replicator(self) -> Any: ...  # a StreamReplicator (progress by replica) or None


class ConsumerList(Protocol):
    def list(self, stream: str) -> Sequence[Any]: ...  # consumers_pb2.ConsumerInfo


class RaftView(Protocol):
    def status(self) -> Any: ...  # raft.api.GroupStatus


@dataclass
class NodeState:
    """What the collector reads. `streams` is the engine's map of local streams; the Raft
    group and failover coordinator are None on a standalone node."""

    streams: Mapping[str, StreamView]
    consumers: ConsumerList
    fsyncs: Callable[[], int]
    raft: RaftView | None = None
    failovers: Callable[[], int] | None = None  # promotions this node committed as leader


@dataclass
class Snapshot:
    """Plain values copied on the loop thread; turned into families on the scrape's thread."""

    fsyncs: int = 0
    streams: list[tuple[str, bool, int, int]] = field(default_factory=list)  # name, leads, ...
    lags: list[tuple[str, str, int]] = field(default_factory=list)  # stream, replica, messages
    consumers: list[tuple[str, str, int, int]] = field(default_factory=list)
    raft: Any = None
    failovers: int | None = None


def leads(stream: StreamView) -> bool:
    return stream.role == ROLE_PRIMARY and stream.deposed is None


def take_snapshot(state: NodeState) -> Snapshot:
    """Copies what the families need; runs on the node's event loop."""
    snap = Snapshot(fsyncs=state.fsyncs())
    for name, stream in list(state.streams.items()):
        leading = leads(stream)
        snap.streams.append((name, leading, stream.commit_seq, stream.last_seq))
        if not leading:
            continue
        progress = getattr(stream.replicator, "progress", None) or {}
        for replica, seen in sorted(progress.items()):
            snap.lags.append((name, replica, max(0, stream.last_seq - seen.match_seq)))
        try:
            infos = state.consumers.list(name)
        except RaftlogError:  # not served here (yet): nothing to report
            continue
        for info in infos:
            snap.consumers.append((name, info.config.name, info.state.num_pending,
                                   info.state.num_ack_pending))
    if state.raft is not None:
        snap.raft = state.raft.status()
    if state.failovers is not None:
        snap.failovers = state.failovers()
    return snap


def families(snap: Snapshot) -> Iterator[Metric]:
    """The metric families of one snapshot."""
    yield CounterMetricFamily("raftlog_fsyncs", "fsyncs of the node's database (group commit).",
                              value=snap.fsyncs)
    yield from _stream_families(snap)
    lag = GaugeMetricFamily(
        "raftlog_replication_lag_messages", "Messages a replica has not acknowledged yet, for "
        "each stream this node leads.", labels=["stream", "replica"])
    for stream, replica, behind in snap.lags:
        lag.add_metric([stream, replica], behind)
    yield lag
    yield from _consumer_families(snap)
    if snap.raft is not None:
        yield from _raft_families(snap.raft)
    if snap.failovers is not None:
        yield CounterMetricFamily(
            "raftlog_failover_promotions", "Streams this node promoted a new primary for, "
            "as the Raft leader (one per stream failed over).", value=snap.failovers)


def _stream_families(snap: Snapshot) -> Iterator[Metric]:
    commit = GaugeMetricFamily("raftlog_stream_commit_seq", "The stream's highest committed "
                               "seq as this node knows it.", labels=["stream"])
    last = GaugeMetricFamily("raftlog_stream_last_seq", "The stream's highest seq stored on "
                             "this node (committed or not).", labels=["stream"])
    leader = GaugeMetricFamily("raftlog_stream_is_primary", "1 when this node is the stream's "
                               "serving primary, 0 when it holds a replica.", labels=["stream"])
    count = GaugeMetricFamily("raftlog_streams", "Streams stored on this node, by role.",
                              labels=["role"])
    for name, leading, commit_seq, last_seq in snap.streams:
        commit.add_metric([name], commit_seq)
        last.add_metric([name], last_seq)
        leader.add_metric([name], int(leading))
    primaries = sum(1 for _, leading, _, _ in snap.streams if leading)
    count.add_metric(["primary"], primaries)
    count.add_metric(["replica"], len(snap.streams) - primaries)
    yield from (commit, last, leader, count)


def _consumer_families(snap: Snapshot) -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        "raftlog_consumer_pending_messages", "Messages the consumer has not been handed yet "
        "(num_pending), for consumers of streams this node leads.", labels=["stream", "consumer"])
    ack_pending = GaugeMetricFamily(
        "raftlog_consumer_ack_pending_messages", "Messages handed out and not acknowledged yet "
        "(num_ack_pending).", labels=["stream", "consumer"])
    for stream, consumer, waiting, unacked in snap.consumers:
        pending.add_metric([stream, consumer], waiting)
        ack_pending.add_metric([stream, consumer], unacked)
    yield from (pending, ack_pending)


def _raft_families(status: Any) -> Iterator[Metric]:
    gauges: Iterable[tuple[str, str, float]] = (
        ("raftlog_raft_term", "The metadata group's current Raft term.", status.term),
        ("raftlog_raft_is_leader", "1 while this node leads the metadata group.",
         int(status.is_leader)),
        ("raftlog_raft_leader_known", "1 while this node knows a leader of the metadata group.",
         int(status.leader is not None)),
        ("raftlog_raft_has_quorum", "1 while this node has a Raft connection to a majority "
         "of the members, itself included.", int(status.has_quorum)),
        ("raftlog_raft_commit_index", "The metadata log's commit index here.",
         status.commit_index),
        ("raftlog_raft_applied_index", "The metadata log's applied index here.",
         status.applied_index),
    )
    for name, text, value in gauges:
        yield GaugeMetricFamily(name, text, value=value)


class StateCollector(Collector):
    """Registered in the node's registry; `collect` runs on the scrape's thread and reads the
    state on `loop` (directly when there is none, or when called on the loop itself)."""

    def __init__(self, state: NodeState, *, loop: asyncio.AbstractEventLoop | None) -> None:
        self._state = state
        self._loop = loop

    def describe(self) -> list[Metric]:
        return []  # unknown before the first scrape: the registry then skips name checks

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield GaugeMetricFamily("raftlog_metrics_state_ok", "1 when this scrape could read the "
                                "node's state in time, 0 when the event loop was too busy.",
                                value=int(snap is not None))
        if snap is not None:
            yield from families(snap)

    def _snapshot(self) -> Snapshot | None:
        loop = self._loop
        try:
            if loop is None or _on_loop(loop):
                return take_snapshot(self._state)
            if not loop.is_running():  # stopping: nothing left to read safely
                return None
            return self._snapshot_on(loop)
        except Exception:
            log.exception("metrics: reading the node's state failed")
            return None

    def _snapshot_on(self, loop: asyncio.AbstractEventLoop) -> Snapshot | None:
        result: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

        def fill() -> None:
            if result.set_running_or_notify_cancel():
                try:
                    result.set_result(take_snapshot(self._state))
                except BaseException as exc:
                    result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(fill)
            return result.result(timeout=limits.metrics_snapshot_timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError):  # busy, or closed meanwhile
            result.cancel()
            return None


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
