"""Repeated log lines are rate limited per (logger, template) (node/log_limit.py), on a fake
clock and a real logging handler. Each test is named after the rule it checks."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.node import log_limit

RECORDS_MAX = 3
WINDOW_S = 10.0


class Sink:
    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []

    def __call__(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[str]:
        return [record.getMessage() for record in self.records]


def _record(template: str = "peer %s unreachable", *args: object, name: str = "raftlog.x",
            level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name=name, level=level, pathname=__file__, lineno=1, msg=template,
                             args=args or ("n2",), exc_info=None)


def _limiter(clock: FakeClock, sink: Sink, *, templates_max: int = 100
             ) -> log_limit.RepeatLimitFilter:
    return log_limit.RepeatLimitFilter(sink=sink, records_max=RECORDS_MAX, window_s=WINDOW_S,
                                       templates_max=templates_max, clock=clock)


def test_at_most_records_max_of_one_template_pass_per_window() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    passed = [limiter.filter(_record("peer %s unreachable", f"n{i}")) for i in range(50)]
    assert passed == [True] * RECORDS_MAX + [False] * (50 - RECORDS_MAX)
    assert sink.records == []


def test_after_the_window_one_line_reports_how_many_were_suppressed() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    for _ in range(RECORDS_MAX + 7):
        limiter.filter(_record())
    clock.advance(WINDOW_S)
    assert limiter.filter(_record()) is True  # a new window
    [summary] = sink.records
    assert summary.getMessage().startswith("suppressed 7 more lines like 'peer %s unreachable'")
    assert summary.name == "raftlog.x" and summary.levelno == logging.WARNING
    assert limiter.filter(summary) is True  # its own summaries always pass


def test_the_summary_comes_with_a_record_of_any_template() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    for _ in range(RECORDS_MAX + 1):
        limiter.filter(_record())
    clock.advance(WINDOW_S + 1)
    limiter.filter(_record("something else"))
    assert len(sink.records) == 1 and "suppressed 1 more" in sink.lines()[0]


def test_templates_and_loggers_are_counted_apart() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    for _ in range(RECORDS_MAX):
        assert limiter.filter(_record("a %s"))
        assert limiter.filter(_record("b %s"))
        assert limiter.filter(_record("a %s", name="raftlog.y"))
    assert not limiter.filter(_record("a %s"))


def test_a_window_without_suppressed_records_leaves_no_summary() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    for _ in range(RECORDS_MAX):
        limiter.filter(_record())
    clock.advance(WINDOW_S)
    limiter.filter(_record())
    limiter.flush()
    assert sink.records == []


def test_tracked_templates_are_bounded_and_the_oldest_is_summarised_first() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink, templates_max=2)
    for _ in range(RECORDS_MAX + 2):
        limiter.filter(_record("first %s"))
    limiter.filter(_record("second %s"))
    limiter.filter(_record("third %s"))  # evicts "first"
    assert len(sink.records) == 1 and "2 more lines like 'first %s'" in sink.lines()[0]
    assert limiter.filter(_record("first %s")) is True  # counted afresh


def test_flush_reports_windows_that_have_not_ended() -> None:
    clock, sink = FakeClock(), Sink()
    limiter = _limiter(clock, sink)
    for _ in range(RECORDS_MAX + 4):
        limiter.filter(_record())
    limiter.flush()
    assert len(sink.records) == 1 and "suppressed 4 more" in sink.lines()[0]


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    logger = logging.Logger("test_log_limit", level=logging.INFO)  # not in logging's registry
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    yield logger, out


def test_installed_on_a_handler_a_flood_becomes_the_limit_plus_one_line(
        logger: tuple[logging.Logger, io.StringIO]) -> None:
    log, out = logger
    clock = FakeClock()
    [limiter] = log_limit.install(log, clock=clock)
    for i in range(1_000):
        log.warning("malformed request to %s from %s", "/raftlog.v1.Streams/Publish", i)
    clock.advance(limits.log_repeat_window_s)
    log.info("a different line")
    lines = out.getvalue().splitlines()
    assert len(lines) == limits.log_repeats_max + 2, lines
    assert lines[-2].startswith(f"WARNING test_log_limit: suppressed "
                                f"{1_000 - limits.log_repeats_max} more lines")
    assert lines[-1].endswith("a different line")
    limiter.flush()
