"""JSON log lines and request ids (node/transport/logctx.py, rpc.py, calls.py): the line format,
the per-call fields, the repeat limiter behind a JSON handler (fake clock), the request id a
call takes, returns and forwards, and the stream and epoch on lines of the node's own loops
(a primary's replication, the failover round) driven in-process with fakes. Each test is
named after the rule it checks."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node import log_limit
from raftlog.node.cli import localcluster
from raftlog.node.cluster import failover
from raftlog.node.replication import primary
from raftlog.node.transport import logctx, rpc
from raftlog.node.transport.calls import HOPS_HEADER, Call
from raftlog.v1 import streams_pb2

cli_main = importlib.import_module("raftlog.node.cli.main")  # the package exports main()
REQUIRED_KEYS = {"ts", "level", "logger", "message", "node"}


def _handler(stream: io.StringIO) -> logging.StreamHandler[io.StringIO]:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logctx.JsonFormatter(node="n1"))
    return handler


def _logger(handler: logging.Handler, name: str = "raftlog.test.json") -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_is_one_json_object_with_the_required_keys() -> None:
    stream = io.StringIO()
    _logger(_handler(stream)).warning("peer %s unreachable\nsecond line", "n2")
    [line] = _lines(stream)
    assert set(line) >= REQUIRED_KEYS
    assert line["level"] == "WARNING" and line["logger"] == "raftlog.test.json"
    assert line["message"] == "peer n2 unreachable\nsecond line" and line["node"] == "n1"
    assert "request_id" not in line and "exc" not in line


def test_ts_is_iso_8601_utc_with_milliseconds() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.created = 1_764_030_000.1239
    line = json.loads(logctx.JsonFormatter(node="n1").format(record))
    assert line["ts"] == "2025-11-25T00:20:00.123Z"


def test_an_exception_line_carries_the_traceback_in_exc() -> None:
    stream = io.StringIO()
    logger = _logger(_handler(stream))
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("sweep failed")
    [line] = _lines(stream)
    assert line["message"] == "sweep failed" and line["level"] == "ERROR"
    assert line["exc"].startswith("Traceback") and "ValueError: boom" in line["exc"]


def test_the_fields_of_the_running_call_appear_and_leave_with_it() -> None:
    stream = io.StringIO()
    logger = _logger(_handler(stream))
    with logctx.bind(request_id="r-1", method="Streams.Publish", stream="orders", epoch=7):
        with logctx.bind(consumer="billing"):
            logger.info("inside")
        logger.info("outer", extra={"stream": "other"})  # a record's own field wins
    logger.info("after")
    inside, outer, after = _lines(stream)
    assert (inside["request_id"], inside["method"], inside["stream"], inside["epoch"],
            inside["consumer"]) == ("r-1", "Streams.Publish", "orders", 7, "billing")
    assert outer["stream"] == "other" and "consumer" not in outer
    assert not set(logctx.CALL_FIELDS) & set(after)


def test_a_task_started_by_a_call_keeps_its_fields() -> None:
    stream = io.StringIO()
    logger = _logger(_handler(stream))

    async def call() -> None:
        with logctx.bind(request_id="r-task"):
            await asyncio.get_running_loop().create_task(_log_later(logger))

    asyncio.run(call())
    assert _lines(stream)[0]["request_id"] == "r-task"


async def _log_later(logger: logging.Logger) -> None:
    await asyncio.sleep(0)
    logger.info("in a task")


def test_repeated_lines_are_limited_and_summarised_as_json_without_call_fields() -> None:
    clock, stream = FakeClock(), io.StringIO()
    handler = _handler(stream)
    handler.addFilter(log_limit.RepeatLimitFilter(sink=handler.handle, records_max=3,
                                                  window_s=10.0, clock=clock))
    logger = _logger(handler)
    with logctx.bind(request_id="r-flood"):
        for k in range(20):
            logger.warning("malformed request %d", k)
    clock.advance(11.0)
    with logctx.bind(request_id="r-later"):
        logger.info("something else")
    lines = _lines(stream)
    assert [line["message"] for line in lines[:3]] == [f"malformed request {k}" for k in range(3)]
    summary, last = lines[3:]
    assert summary["message"].startswith("suppressed 17 more lines like 'malformed request %d'")
    assert summary["level"] == "WARNING" and "request_id" not in summary
    assert last["request_id"] == "r-later"
    assert logctx.NO_CALL_FIELDS_ATTR == log_limit.SUMMARY_ATTR


@pytest.mark.parametrize(("sent", "kept"), [
    ("abc-123", True),
    ("a" * limits.request_id_bytes_max, True),
    ("a" * (limits.request_id_bytes_max + 1), False),
    ("bad id with spaces", False),
    ('x"}\n{"forged": 1', False),
    ("", False),
])
def test_a_valid_request_id_is_kept_and_any_other_replaced(sent: str, kept: bool) -> None:
    taken = logctx.incoming_request_id([("other", "v"), (logctx.REQUEST_ID_HEADER, sent)])
    assert (taken == sent) is kept
    assert logctx.valid_request_id(taken)


def test_a_call_without_a_request_id_gets_a_new_one_each_time() -> None:
    first, second = logctx.incoming_request_id(()), logctx.incoming_request_id(None)
    assert first != second and logctx.valid_request_id(first)


def test_a_forwarded_call_carries_the_request_id_of_the_running_call() -> None:
    call = Call(metadata=(("x-app", "1"), (logctx.REQUEST_ID_HEADER, "from-caller")), hops=1)
    assert call.outgoing() == [("x-app", "1"), (logctx.REQUEST_ID_HEADER, "from-caller"),
                               (HOPS_HEADER, "2")]  # no call running: sent on as it came
    with logctx.bind(request_id="given-here"):
        assert call.outgoing() == [("x-app", "1"), (HOPS_HEADER, "2"),
                                   (logctx.REQUEST_ID_HEADER, "given-here")]


class FakeContext:
    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.trailers: tuple[tuple[str, str], ...] = ()
        self.aborted: grpc.Status | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_trailing_metadata(self, trailers: tuple[tuple[str, str], ...]) -> None:
        self.trailers = trailers

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.aborted = status
        raise grpc.aio.AbortError()


class Service:
    def __init__(self) -> None:
        self.seen: dict[str, str | int] = {}

    @rpc.unary
    async def Publish(self, request: streams_pb2.PublishRequest, context: Any) -> str:
        self.seen = dict(logctx.current())
        if request.subject == "refuse":
            raise RaftlogError(Reason.INVALID_ARGUMENT, "refused")
        return "ok"


def test_a_call_runs_with_its_request_id_and_returns_it_in_the_trailers() -> None:
    service, context = Service(), FakeContext(((logctx.REQUEST_ID_HEADER, "r-42"),))
    request = streams_pb2.PublishRequest(stream="orders", subject="s")
    assert asyncio.run(service.Publish(request, context)) == "ok"
    assert service.seen == {"request_id": "r-42", "method": "Service.Publish",
                            "stream": "orders"}
    assert context.trailers == ((logctx.REQUEST_ID_HEADER, "r-42"),)
    assert logctx.request_id() is None


def test_a_refused_call_still_returns_its_request_id() -> None:
    service, context = Service(), FakeContext(((logctx.REQUEST_ID_HEADER, "r-43"),))
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(service.Publish(streams_pb2.PublishRequest(subject="refuse"), context))
    assert context.aborted is not None
    trailers = dict(context.aborted.trailing_metadata)
    assert trailers[logctx.REQUEST_ID_HEADER] == "r-43"
    assert "grpc-status-details-bin" in trailers


def test_each_method_logs_how_it_ended_at_debug_on_its_own_logger() -> None:
    stream = io.StringIO()
    _logger(_handler(stream), name=f"{rpc.CALLS_LOGGER}.Service.Publish")
    context = FakeContext(((logctx.REQUEST_ID_HEADER, "r-44"),))
    asyncio.run(Service().Publish(streams_pb2.PublishRequest(stream="orders"), context))
    with pytest.raises(grpc.aio.AbortError):
        asyncio.run(Service().Publish(streams_pb2.PublishRequest(subject="refuse"), context))
    ok, refused = _lines(stream)
    assert ok["message"].startswith("Service.Publish ended OK after ")
    assert ok["request_id"] == "r-44" and ok["stream"] == "orders"
    assert refused["message"].startswith("Service.Publish ended INVALID_ARGUMENT after ")


def _run_configured(log_format: str, code: str) -> list[str]:
    script = ("import logging\nfrom raftlog.node.transport import logctx\n"
              f"logctx.configure(log_format={log_format!r}, level='INFO', node='n9')\n{code}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    return done.stderr.splitlines()


def test_json_makes_uncaught_exceptions_and_warnings_json_lines_too() -> None:
    lines = _run_configured("json", "import warnings\nwarnings.warn('old flag')\n"
                                    "logging.getLogger('a').info('hi')\nraise KeyError('k')\n")
    parsed = [json.loads(line) for line in lines]
    assert [line["message"] for line in parsed][1:] == ["hi", "uncaught exception"]
    assert "old flag" in parsed[0]["message"] and parsed[0]["logger"] == "py.warnings"
    assert "KeyError: 'k'" in parsed[2]["exc"] and all(line["node"] == "n9" for line in parsed)


def test_text_is_the_format_the_node_always_wrote() -> None:
    [line] = _run_configured("text", "logging.getLogger('raftlog.x').warning('peer %s', 'n2')\n")
    date, clock, rest = line.split(" ", 2)
    assert rest == "WARNING raftlog.x: peer n2"
    assert len(date) == 10 and len(clock) == 12  # 2026-11-25 00:20:18,123


class _Started(Exception):
    pass


@pytest.mark.parametrize(("flags", "node_args"), [
    ([], []),
    (["--log-format", "text"], []),
    (["--log-format", "json"], ["--log-format", "json"]),
])
def test_cluster_up_passes_json_to_every_node_and_nothing_by_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flags: list[str],
        node_args: list[str]) -> None:
    seen: dict[str, Any] = {}

    def up(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Started

    monkeypatch.setattr(localcluster, "up", up)
    with pytest.raises(_Started):
        cli_main.main(["cluster", "up", "--data", str(tmp_path), "--no-wait", *flags])
    extra = seen["extra_args"]
    assert ([] if extra is None else list(extra(None))) == node_args


def test_the_node_takes_text_unless_told_json() -> None:
    parser = cli_main.build_parser()
    assert parser.parse_args(["node", "--data", "d"]).log_format == "text"
    assert parser.parse_args(["node", "--data", "d", "--log-format", "json"]).log_format == "json"


class BareContext:
    """A context without gRPC metadata, as the simulator's (chaos/sim/node.py)."""

    async def abort_with_status(self, status: grpc.Status) -> None:
        raise grpc.aio.AbortError()


def test_a_context_without_metadata_still_runs_under_a_new_request_id() -> None:
    service = Service()
    assert asyncio.run(service.Publish(streams_pb2.PublishRequest(), BareContext())) == "ok"
    assert logctx.valid_request_id(str(service.seen["request_id"]))


# --- the node's own loops: lines about one stream carry it (and its epoch)


def test_fields_makes_an_extra_of_the_known_fields_and_leaves_out_empty_ones() -> None:
    assert logctx.fields(stream="orders", epoch=3, consumer=None) == {"stream": "orders",
                                                                      "epoch": 3}
    assert logctx.fields(stream="") == {}
    with pytest.raises(ValueError, match="subject"):
        logctx.fields(subject="a.b")


def test_a_task_started_in_the_background_context_does_not_inherit_a_bound_stream() -> None:
    stream = io.StringIO()
    logger = _logger(_handler(stream))

    async def reconcile() -> None:
        with logctx.bind(stream="orders", epoch=2):
            loop = asyncio.get_running_loop()
            inherited = loop.create_task(_log_later(logger))
            detached = loop.create_task(_log_later(logger), context=logctx.background())
            await asyncio.gather(inherited, detached)

    asyncio.run(reconcile())
    inherited, detached = _lines(stream)
    assert (inherited["stream"], inherited["epoch"]) == ("orders", 2)
    assert "stream" not in detached and "epoch" not in detached


@contextlib.contextmanager
def _module_log(name: str) -> Iterator[io.StringIO]:
    """The JSON lines a real module's logger writes in the block; its handlers, level and
    propagation are given back afterwards."""
    logger = logging.getLogger(name)
    kept = (logger.handlers[:], logger.propagate, logger.level)
    stream = io.StringIO()
    _logger(_handler(stream), name=logger.name)
    try:
        yield stream
    finally:
        logger.handlers[:], logger.propagate = kept[0], kept[1]
        logger.setLevel(kept[2])


class _Links:
    """What a StreamReplicator asks of its LinkSet on a refusal."""

    def __init__(self) -> None:
        self.retries: list[float] = []

    def retry(self, replicator: Any, *, after_s: float) -> None:
        self.retries.append(after_s)


class _Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.deposed: RaftlogError | None = None
        self.replicator: Any = None

    def depose(self, error: RaftlogError) -> None:
        self.deposed = error


def _replicator(links: _Links, stream: _Stream) -> primary.StreamReplicator:
    return primary.StreamReplicator(
        stream=stream, node_id="n1", replicas=("n1", "n2", "n3"), epoch=4, history=[(4, 1)],
        links=links, clock=FakeClock())  # type: ignore[arg-type]


def test_a_primarys_replication_lines_carry_the_stream_and_its_epoch() -> None:
    """Written from a link's task, which serves many streams: no call fields to inherit."""
    links, stream = _Links(), _Stream("orders")
    replicator = _replicator(links, stream)
    with _module_log(primary.__name__) as module_log:
        replicator.on_ack("n2", replication_pb2.ReplicateAck(
            stream="orders", refused=Reason.STREAM_NOT_FOUND.name, message="no copy yet"))
        replicator.on_ack("n3", replication_pb2.ReplicateAck(  # a fence notice from a survey
            stream="orders", refused=Reason.STALE_EPOCH.name, replica_epoch=5))
    refused, stepping_down = _lines(module_log)
    assert refused["message"].startswith("stream orders: replica n2 refused a batch")
    assert stepping_down["message"].endswith("stepping down") and stepping_down["level"] == \
        "WARNING"
    for line in (refused, stepping_down):
        assert (line["stream"], line["epoch"]) == ("orders", 4)
    assert links.retries and stream.deposed is not None and replicator.stopped


class _Group:
    """The metadata group as the failover round proposes to it: every promote applies."""

    def __init__(self) -> None:
        self.proposed: list[raft_pb2.RaftCommand] = []

    async def propose(self, command: raft_pb2.RaftCommand, *,
                      timeout_s: float) -> raft_pb2.RaftResult:
        self.proposed.append(command)
        return raft_pb2.RaftResult(ok=True)


def _promote(stream: str, epoch: int) -> raft_pb2.StreamPromote:
    return raft_pb2.StreamPromote(stream=stream, new_primary="n2", new_fence_epoch=epoch,
                                  epoch_start_seq=11, replicas=["n1", "n2", "n3"])


def _need(stream: str, epoch: int) -> failover.Need:
    return failover.Need(name=stream, primary="n1", replicas=("n1", "n2", "n3"),
                         fence_epoch=epoch, why="n1 is silent")


def test_the_failover_line_of_one_promoted_stream_carries_it_and_a_rounds_summary_none() -> None:
    group = _Group()
    coordinator = failover.FailoverCoordinator(
        node_id="n3", group=group, liveness=None, peers=None,  # type: ignore[arg-type]
        clock=FakeClock())
    with _module_log(failover.__name__) as module_log:
        asyncio.run(coordinator._promote([_promote("orders", 5)],
                                         needs={"orders": _need("orders", 4)}, started=0.0))
        asyncio.run(coordinator._promote([_promote("a", 2), _promote("b", 8)],
                                         needs={"a": _need("a", 1), "b": _need("b", 7)},
                                         started=0.0))
    one, summary = _lines(module_log)
    assert one["message"].startswith("failover: promoted 1 streams in ")
    assert (one["stream"], one["epoch"]) == ("orders", 5)
    assert summary["message"].startswith("failover: promoted 2 streams in ")
    assert "stream" not in summary and "epoch" not in summary
    assert len(group.proposed) == 2 and len(coordinator.failovers) == 3
