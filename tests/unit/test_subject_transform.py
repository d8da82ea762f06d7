"""Subject transforms (base/subject_transform.py), the sources of a stream config
(node/engine/stream_config.py) and the CLI's --source SPEC (node/cli/sources.py). Each case is
named after the rule it checks."""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.base.subject_transform import SubjectTransform, TransformMismatch
from raftlog.node.cli.sources import parse_source_spec
from raftlog.node.engine.stream_config import validate_config
from raftlog.v1 import types_pb2

APPLIED = [
    # (rule, pattern, destination, subject, result)
    ("star_captures_one_token", "events.*.>", "audit.{{wildcard(1)}}.x", "events.eu.a.b",
     "audit.eu.x"),
    ("gt_captures_the_rest", "events.*.>", "audit.{{wildcard(2)}}", "events.eu.a.b",
     "audit.a.b"),
    ("nats_capital_spelling", "events.*.>", "audit.{{Wildcard(1)}}", "events.eu.a", "audit.eu"),
    ("spaces_inside_braces", "a.*", "b.{{ wildcard( 1 ) }}", "a.x", "b.x"),
    ("wildcards_reordered", "a.*.*", "b.{{wildcard(2)}}.{{wildcard(1)}}", "a.x.y", "b.y.x"),
    ("a_wildcard_twice", "a.*", "{{wildcard(1)}}.{{wildcard(1)}}", "a.x", "x.x"),
    ("inside_a_token", "a.*", "b.pre-{{wildcard(1)}}-post", "a.x", "b.pre-x-post"),
    ("literal_destination", "a.>", "all", "a.b.c", "all"),
    ("literal_pattern", "a.b", "c.d", "a.b", "c.d"),
]


@pytest.mark.parametrize(("rule", "pattern", "destination", "subject", "result"), APPLIED,
                         ids=[case[0] for case in APPLIED])
def test_transform_applies(rule: str, pattern: str, destination: str, subject: str,
                           result: str) -> None:
    transform = SubjectTransform.parse(pattern=pattern, destination=destination)
    assert transform.apply(subject) == result


@pytest.mark.parametrize(("pattern", "subject"), [
    ("events.*.>", "events.eu"), ("events.*", "events.eu.x"), ("a.b", "a.c"), ("a.>", "a"),
    ("events.*.>", "orders.eu.x"),
])
def test_a_subject_the_pattern_does_not_match_is_a_mismatch(pattern: str, subject: str) -> None:
    transform = SubjectTransform.parse(pattern=pattern, destination="x.y")
    with pytest.raises(TransformMismatch, match="does not match"):
        transform.apply(subject)


REFUSED = [
    # (rule, pattern, destination, text in the error)
    ("wildcard_the_pattern_lacks", "a.*", "b.{{wildcard(2)}}", "has 1 wildcard"),
    ("wildcard_zero", "a.*", "b.{{wildcard(0)}}", "refers to wildcard 0"),
    ("no_wildcards_at_all", "a.b", "c.{{wildcard(1)}}", "has 0 wildcard"),
    ("unknown_function", "a.*", "b.{{partition(3,1)}}", "unsupported function"),
    ("non_numeric_argument", "a.*", "b.{{wildcard(x)}}", "takes a number"),
    ("unbalanced_braces", "a.*", "b.{{wildcard(1)", "unbalanced"),
    ("wildcard_in_destination", "a.*", "b.*", "wildcards"),
    ("empty_destination", "a.*", "", "destination is empty"),
    ("empty_token_in_destination", "a.*", "b..{{wildcard(1)}}", "empty token"),
    ("bad_pattern", "a.>.b", "c", "must be the last token"),
]


@pytest.mark.parametrize(("rule", "pattern", "destination", "text"), REFUSED,
                         ids=[case[0] for case in REFUSED])
def test_transform_refused(rule: str, pattern: str, destination: str, text: str) -> None:
    with pytest.raises(RaftlogError, match=text) as caught:
        SubjectTransform.parse(pattern=pattern, destination=destination)
    assert caught.value.reason is Reason.INVALID_CONFIG


def _config(*sources: types_pb2.StreamSource) -> types_pb2.StreamConfig:
    return types_pb2.StreamConfig(name="audit", sources=list(sources))


def _source(**fields: Any) -> types_pb2.StreamSource:
    fields.setdefault("stream", "orders")
    return types_pb2.StreamSource(**fields)


CONFIG_REFUSED = [
    # (rule, sources, text in the error)
    ("itself", [_source(stream="audit")], "cannot source from itself"),
    ("listed_twice", [_source(), _source(filter_subject="a")], "listed twice"),
    ("bad_name", [_source(stream="a.b")], "may only contain"),
    ("empty_name", [_source(stream="")], "name is empty"),
    ("bad_filter", [_source(filter_subject="a..b")], "empty token"),
    ("start_seq_and_time", [_source(start_seq=3, start_time_ms=5)], "exclusive"),
    ("negative_time", [_source(start_time_ms=-1)], "negative"),
    ("unknown_on_drop", [_source(on_drop=7)], "unknown on_drop"),
    ("dlq_is_itself", [_source(dlq_stream="audit")], "dead-letter stream cannot"),
    ("bad_dlq_name", [_source(dlq_stream="x y")], "may only contain"),
    ("transform_wildcard_missing", [_source(subject_transform=types_pb2.SubjectTransform(
        source_pattern="orders.*", destination="a.{{wildcard(2)}}"))], "has 1 wildcard"),
    ("transform_from_filter", [_source(filter_subject="orders.eu", subject_transform=(
        types_pb2.SubjectTransform(destination="a.{{wildcard(1)}}")))], "has 0 wildcard"),
    ("too_many", [_source(stream=f"s{i}") for i in range(limits.sources_per_stream_max + 1)],
     "more than"),
]


@pytest.mark.parametrize(("rule", "sources", "text"), CONFIG_REFUSED,
                         ids=[case[0] for case in CONFIG_REFUSED])
def test_source_config_refused(rule: str, sources: list[types_pb2.StreamSource],
                               text: str) -> None:
    with pytest.raises(RaftlogError, match=text) as caught:
        validate_config(_config(*sources))
    assert caught.value.reason is Reason.INVALID_CONFIG


def test_a_source_that_does_not_exist_yet_is_accepted() -> None:
    config = validate_config(_config(_source(stream="not-yet", filter_subject="a.>",
                                             dlq_stream="errors")))
    assert [s.stream for s in config.sources] == ["not-yet"]


def test_a_transform_without_pattern_uses_the_filter() -> None:
    config = validate_config(_config(_source(filter_subject="orders.*", subject_transform=(
        types_pb2.SubjectTransform(destination="a.{{wildcard(1)}}")))))
    assert config.sources[0].subject_transform.destination == "a.{{wildcard(1)}}"


def test_spec_with_every_setting() -> None:
    source = parse_source_spec("orders,filter=orders.eu.>,start-seq=5,"
                               "transform=orders.*.>=>audit.{{wildcard(1)}}.x,backfill=100,"
                               "on-drop=skip,dlq=errors")
    assert source == types_pb2.StreamSource(
        stream="orders", filter_subject="orders.eu.>", start_seq=5,
        subject_transform=types_pb2.SubjectTransform(source_pattern="orders.*.>",
                                                     destination="audit.{{wildcard(1)}}.x"),
        max_initial_backfill=100, on_drop=types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE,
        dlq_stream="errors")


def test_spec_start_time_is_utc_unless_it_says_otherwise() -> None:
    assert parse_source_spec("o,start-time=1970-01-01T00:00:01").start_time_ms == 1000
    assert parse_source_spec("o,start-time=1970-01-01T01:00:01+01:00").start_time_ms == 1000
    assert parse_source_spec("o,start-time=1970-01-01T00:00:02Z").start_time_ms == 2000


SPEC_REFUSED = [
    ("unknown_setting", "orders,colour=red", "unknown setting"),
    ("no_value", "orders,filter", "unknown setting"),
    ("twice", "orders,backfill=1,backfill=2", "given twice"),
    ("bad_number", "orders,start-seq=-3", "whole number"),
    ("bad_time", "orders,start-time=yesterday", "ISO time"),
    ("seq_and_time", "orders,start-seq=1,start-time=2026-01-01T00:00:00Z", "exclusive"),
    ("transform_without_arrow", "orders,transform=a.*", "SRC=>DST"),
    ("bad_transform", "orders,transform=a.*=>b.{{wildcard(3)}}", "has 1 wildcard"),
    ("bad_on_drop", "orders,on-drop=maybe", "halt or skip"),
    ("bad_name", "or/ders", "may only contain"),
    ("empty", "", "name is empty"),
    ("bad_filter", "orders,filter=a.>.b", "must be the last token"),
]


@pytest.mark.parametrize(("rule", "spec", "text"), SPEC_REFUSED,
                         ids=[case[0] for case in SPEC_REFUSED])
def test_spec_refused(rule: str, spec: str, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        parse_source_spec(spec)


def test_a_bad_spec_on_the_command_line_exits_2_and_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    from raftlog.node.cli.main import main
    assert main(["stream", "create", "audit", "--source",
                 "orders,transform=a.*=>b.{{wildcard(2)}}"]) == 2
    assert "refers to wildcard 2" in capsys.readouterr().err
