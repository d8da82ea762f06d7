"""Every divergence class on tiny inline frames (one stream per scenario, `scenarios.py`,
classified in one Spark job): the exact rows, and the exact repair-plan actions."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from raftlog.audit import classes, plan
from raftlog.audit.classify import classify
from raftlog.audit.divergence import Divergence
from tests.audit import scenarios

Row = tuple[str, str, int | None, int | None, tuple[str, ...]]  # node, class, first, last, sources

EXPECTED: dict[str, list[Row]] = {
    "s_clean": [],
    "s_hole": [("n2", classes.HOLE, 4, 6, ("n1", "n3"))],
    "s_tail": [("n3", classes.EXTRA_TAIL, 11, 13, ())],
    "s_content": [("n3", classes.CONTENT, 7, 7, ("n1", "n2"))],
    "s_epoch": [("n3", classes.EPOCH, 6, 8, ("n1", "n2")),
                ("n3", classes.EPOCH_HISTORY, None, None, ())],
    "s_head": [("n3", classes.HEAD, 1, 3, ("n1", "n2"))],
    "s_retention": [],
    "s_unknown": [("n1", classes.UNKNOWN_STREAM, 1, 3, ())],
    "s_unlisted": [("n3", classes.UNLISTED_REPLICA, 1, 10, ())],
    "s_notexp": [("n4", classes.NOT_EXPORTED, None, None, ())],
    "s_meta": [("n3", classes.META_VIEW, None, None, ())],
    "s_consumer": [("n1", classes.CONSUMER, None, None, ()),
                   ("n2", classes.CONSUMER, None, None, ()),
                   ("n2", classes.CONSUMER, None, None, ()),
                   ("n3", classes.CONSUMER, None, None, ())],
    "s_lag": [("n3", classes.HOLE, 8, 10, ("n1", "n2"))],
    "s_fallback": [("n2", classes.HOLE, 9, 9, ("n1",)),
                   ("n3", classes.HOLE, 9, 9, ("n1",)),
                   ("n3", classes.HOLE, 10, 10, ("n1", "n2"))],
    "s_ambiguous": [("n1", classes.CONTENT, 5, 5, ()), ("n2", classes.CONTENT, 5, 5, ()),
                    ("n3", classes.CONTENT, 5, 5, ())],
    "s_absent": [("n3", classes.HOLE, 1, 10, ("n1", "n2"))],
    "s_majority_bad_epoch": [("n1", classes.EPOCH, 5, 5, ("n3",)),
                             ("n1", classes.EPOCH_HISTORY, None, None, ()),
                             ("n2", classes.EPOCH, 5, 5, ("n3",)),
                             ("n2", classes.EPOCH_HISTORY, None, None, ()),
                             ("n3", classes.EPOCH_HISTORY, None, None, ())],
    "s_primary_tail": [("n1", classes.EXTRA_TAIL, 11, 12, ())],
}

# (node, action, the action's own fields) per stream; "unplanned" lists the labels skipped.
PLANNED: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "s_hole": [("n2", "copy", {"from_node": "n1", "first_seq": 4, "last_seq": 6,
                               "touches_committed": False})],
    "s_tail": [("n3", "truncate", {"after_seq": 10, "expect_last_seq": 13,
                                   "touches_committed": False})],
    "s_content": [("n3", "copy", {"from_node": "n1", "first_seq": 7, "last_seq": 7,
                                  "touches_committed": True})],
    "s_epoch": [("n3", "copy", {"from_node": "n1", "first_seq": 6, "last_seq": 8,
                                "touches_committed": True})],
    "s_head": [("n3", "copy", {"from_node": "n1", "first_seq": 1, "last_seq": 3,
                               "touches_committed": False})],
    "s_consumer": [
        ("n1", "consumer", {"consumer": "d", "holder": "raft", "delivered_seq": 10,
                            "ack_floor": 10, "acked": [], "touches_committed": False}),
        ("n2", "consumer", {"consumer": "c", "holder": "store", "delivered_seq": 5,
                            "ack_floor": 3, "acked": [5], "touches_committed": False})],
    "s_lag": [("n3", "copy", {"from_node": "n1", "first_seq": 8, "last_seq": 10,
                              "touches_committed": False})],
    "s_fallback": [("n2", "copy", {"from_node": "n1", "first_seq": 9, "last_seq": 9,
                                   "touches_committed": False}),
                   ("n3", "copy", {"from_node": "n1", "first_seq": 9, "last_seq": 10,
                                   "touches_committed": False})],
    "s_absent": [("n3", "reseed", {"from_node": "n1", "touches_committed": False})],
}
UNPLANNED: dict[str, dict[str, str]] = {  # label -> a phrase of the reason
    "s_epoch": {"EPOCH_HISTORY on n3 of s_epoch": "rewrite them"},
    "s_unknown": {"UNKNOWN_STREAM 1-3 on n1 of s_unknown": "does not know this stream"},
    "s_unlisted": {"UNLISTED_REPLICA 1-10 on n3 of s_unlisted": "does not list this node"},
    "s_notexp": {"NOT_EXPORTED on n4 of s_notexp": "export it"},
    "s_meta": {"META_VIEW on n3 of s_meta": "Raft brings it up to date"},
    "s_consumer": {"CONSUMER d (raft) on n2 of s_consumer": "follower",
                   "CONSUMER d (raft) on n3 of s_consumer": "follower"},
    "s_ambiguous": {"CONTENT 5 on n1 of s_ambiguous": "primary",
                    "CONTENT 5 on n2 of s_ambiguous": "no replica holds",
                    "CONTENT 5 on n3 of s_ambiguous": "no replica holds"},
    "s_majority_bad_epoch": {
        "EPOCH 5 on n1 of s_majority_bad_epoch": "primary",
        "EPOCH 5 on n2 of s_majority_bad_epoch": "held by a majority",
        "EPOCH_HISTORY on n1 of s_majority_bad_epoch": "needs an operator",
        "EPOCH_HISTORY on n2 of s_majority_bad_epoch": "needs an operator",
        "EPOCH_HISTORY on n3 of s_majority_bad_epoch": "needs an operator"},
    "s_primary_tail": {"EXTRA_TAIL 11-12 on n1 of s_primary_tail": "primary"},
}


@pytest.fixture(scope="module")
def found(spark: SparkSession) -> list[Divergence]:
    export = scenarios.build()
    tables = export.tables(spark)
    frame = classify(tables, nodes=export.nodes, view_nodes=export.nodes,
                     slots=3)
    return sorted((Divergence.from_row(row.asDict(recursive=True)) for row in frame.collect()),
                  key=Divergence.sort_key)


@pytest.fixture(scope="module")
def repair(found: list[Divergence]) -> dict[str, Any]:
    return plan.build_plan(found, input_dir="in", created_ms=1)


@pytest.mark.parametrize("stream", sorted(EXPECTED))
def test_each_scenario_classifies_exactly_its_divergences(found: list[Divergence],
                                                          stream: str) -> None:
    rows = sorted((d.node, d.cls, d.first_seq, d.last_seq, d.sources)
                  for d in found if d.stream == stream)
    assert rows == sorted(EXPECTED[stream])


def test_no_stream_outside_the_scenarios_diverges(found: list[Divergence]) -> None:
    assert {d.stream for d in found} <= set(EXPECTED)


@pytest.mark.parametrize("stream", sorted(EXPECTED))
def test_each_scenario_plans_exactly_its_repairs(repair: dict[str, Any], stream: str) -> None:
    actions = [a for a in repair["actions"] if a["stream"] == stream]
    assert [(a["node"], a["action"]) for a in actions] == [
        (node, kind) for node, kind, _ in PLANNED.get(stream, [])]
    for action, (_, _, fields) in zip(actions, PLANNED.get(stream, []), strict=True):
        assert {key: action[key] for key in fields} == fields
        assert action["why"] and action["divergences"]
    skipped = {s["divergence"]: s["reason"] for s in repair["unplanned"]
               if s["divergence"].endswith(f" of {stream}")}
    assert set(skipped) == set(UNPLANNED.get(stream, {}))
    for label, phrase in UNPLANNED.get(stream, {}).items():
        assert phrase in skipped[label]


def test_evidence_names_what_a_reader_needs(found: list[Divergence]) -> None:
    by_stream = {d.stream: d for d in found if d.cls in classes.RECORD_CLASSES}
    content = by_stream["s_content"].evidence
    assert (content["epoch"], content["authority_epoch"], content["votes"],
            content["authority_votes"], content["majority"]) == (1, 1, 1, 2, 2)
    assert content["digest_hash"] != content["authority_digest_hash"]
    assert by_stream["s_head"].evidence["heads"] == {"n1": 1, "n2": 1, "n3": 4}
    assert by_stream["s_tail"].evidence["committed_end"] == 10
    consumers = {(d.node, d.holder, d.consumer): d.evidence for d in found
                 if d.stream == "s_consumer"}
    assert consumers[("n2", "store", "c")]["reasons"] == [
        "differs from the metadata's consumer state"]
    assert consumers[("n1", "raft", "d")]["reasons"] == ["points past the committed end 10"]
    meta = next(d for d in found if d.cls == classes.META_VIEW).evidence
    assert meta["differs"] == ["primary"] and meta["view_node"] == "n1"


def test_a_plan_never_overwrites_a_majority_record_without_saying_why(
        repair: dict[str, Any]) -> None:
    for action in repair["actions"]:
        if action["touches_committed"]:
            assert action["action"] == "copy"
            assert "minority copy" in action["why"]
    assert repair["format"] == "raftlog-audit-repair-plan" and repair["version"] == 2
