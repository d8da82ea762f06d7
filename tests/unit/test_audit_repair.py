"""The repair plan's reader and applier (audit/repair.py) against in-memory copies: what each
action asks of which node, dry runs that change nothing, refusals that stop only their step;
consumer actions as the plan (audit/plan.py) writes them and the applier sends them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.audit import classes, repair
from raftlog.audit.divergence import Divergence
from raftlog.audit.peers import PeerError
from raftlog.audit.plan import build_plan
from raftlog.audit.repair import Action, PlanError, apply_plan, parse_plan
from raftlog.internal import replication_pb2
from raftlog.v1 import cluster_pb2


class MemoryCopies:
    """A node's copies of one stream `s`: seq -> stored bytes; records the repair requests."""

    def __init__(self, messages: dict[int, bytes], *, refuse: str = "") -> None:
        self.messages = dict(messages)
        self.requests: list[replication_pb2.RepairRequest] = []
        self.consumer_requests: list[Any] = []  # RepairConsumer and SetConsumerState requests
        self.refuse = refuse

    def state(self, stream: str) -> replication_pb2.ReplicaState:
        seqs = sorted(self.messages)
        return replication_pb2.ReplicaState(stream=stream, exists=True, epoch=1,
                                            first_seq=seqs[0] if seqs else 1,
                                            last_seq=seqs[-1] if seqs else 0)

    def read(self, stream: str, first_seq: int, last_seq: int
             ) -> Iterator[replication_pb2.LocalMessage]:
        for seq in sorted(self.messages):
            if first_seq <= seq <= last_seq:
                yield replication_pb2.LocalMessage(seq=seq, stored=self.messages[seq])

    def repair(self, request: replication_pb2.RepairRequest) -> replication_pb2.RepairReply:
        if self.refuse:
            raise PeerError(self.refuse)
        self.requests.append(request)
        return replication_pb2.RepairReply(changed=len(request.put.messages) or 1)

    def repair_consumer(self, request: replication_pb2.RepairConsumerRequest
                        ) -> replication_pb2.RepairConsumerReply:
        if self.refuse:
            raise PeerError(self.refuse)
        self.consumer_requests.append(request)
        return replication_pb2.RepairConsumerReply(changed=1)

    def set_consumer_state(self, request: cluster_pb2.SetConsumerStateRequest
                           ) -> cluster_pb2.SetConsumerStateResponse:
        if self.refuse:
            raise PeerError(self.refuse)
        self.consumer_requests.append(request)
        return cluster_pb2.SetConsumerStateResponse(changed=True, raft_index=7, commit_seq=9)


def plan(*actions: dict[str, Any], version: int = 1) -> list[Action]:
    return parse_plan(json.dumps({"format": "raftlog-audit-repair-plan", "version": version,
                                  "actions": list(actions)}))


def test_each_action_asks_the_target_for_what_the_plan_says(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(repair, "put_messages_max", 2)
    source = MemoryCopies({seq: b"m%d" % seq for seq in range(1, 8)})
    target = MemoryCopies({1: b"m1", 7: b"m7"})
    actions = plan(
        {"node": "n2", "stream": "s", "action": "copy", "from_node": "n1", "first_seq": 2,
         "last_seq": 6, "why": "HOLE 2-6", "touches_committed": False},
        {"node": "n2", "stream": "s", "action": "truncate", "after_seq": 5,
         "expect_last_seq": 7, "why": "EXTRA_TAIL 6-7"},
        {"node": "n2", "stream": "s", "action": "reseed", "from_node": "n1", "why": "HEAD"},
        {"node": "n2", "stream": "s", "action": "consumer", "consumer": "c", "why": "CONSUMER"},
    )
    outcomes = apply_plan(actions, {"n1": source, "n2": target}, dry_run=False)
    assert [o.status for o in outcomes] == ["done", "done", "done", "manual"]
    puts = [[m.seq for m in r.put.messages] for r in target.requests if r.HasField("put")]
    assert puts == [[2, 3], [4, 5], [6]]
    truncate = target.requests[3]
    assert (truncate.truncate_after, truncate.expect_last_seq) == (5, 7)
    assert not target.requests[0].HasField("expect_last_seq")
    assert target.requests[4].reset_to == 1  # the source's head
    assert source.requests == []


def test_a_dry_run_changes_nothing_and_a_refusal_stops_only_its_step() -> None:
    actions = plan(
        {"node": "n2", "stream": "s", "action": "truncate", "after_seq": 1, "why": "tail"},
        {"node": "n3", "stream": "s", "action": "truncate", "after_seq": 1, "why": "tail"},
        {"node": "n9", "stream": "s", "action": "truncate", "after_seq": 1, "why": "tail"},
    )
    n2, n3 = MemoryCopies({1: b"a", 2: b"b"}, refuse="COPY_CHANGED"), MemoryCopies({1: b"a"})
    dry = apply_plan(actions, {"n2": n2, "n3": n3}, dry_run=True)
    assert [o.status for o in dry] == ["would do", "would do", "refused"]
    assert n3.requests == []
    done = apply_plan(actions, {"n2": n2, "n3": n3}, dry_run=False)
    assert [o.status for o in done] == ["refused", "done", "refused"]
    assert "COPY_CHANGED" in done[0].detail and "not a member" in done[2].detail


@pytest.mark.parametrize("document, message", [
    ("not json", "cannot read"),
    (json.dumps({"format": "something else", "version": 1, "actions": []}), "not a raftlog"),
    (json.dumps({"format": "raftlog-audit-repair-plan", "version": 9, "actions": []}),
     "version 9"),
    (json.dumps({"format": "raftlog-audit-repair-plan", "version": 1, "actions": {}}),
     "must be a list"),
    (json.dumps({"format": "raftlog-audit-repair-plan", "version": 1,
                 "actions": [{"node": "n1", "stream": "s", "action": "explode"}]}),
     "unknown action"),
    (json.dumps({"format": "raftlog-audit-repair-plan", "version": 1,
                 "actions": [{"node": "", "stream": "s", "action": "truncate"}]}),
     "non-empty"),
])
def test_a_bad_plan_is_refused_before_any_step(document: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_plan(document)


def test_a_bad_field_refuses_its_step_only() -> None:
    actions = [Action("n1", "s", "truncate", "tail", False, {"after_seq": -3}),
               Action("n1", "s", "truncate", "tail", False, {"after_seq": 2})]
    copies = MemoryCopies({1: b"a", 2: b"b", 3: b"c"})
    outcomes = apply_plan(actions, {"n1": copies}, dry_run=False)
    assert [o.status for o in outcomes] == ["refused", "done"]
    assert "after_seq must be a non-negative integer" in outcomes[0].detail
    assert [r.truncate_after for r in copies.requests] == [2]


def consumer_action(holder: str, **changes: Any) -> dict[str, Any]:
    """A version 2 consumer action as audit/plan.py writes it."""
    action = {"node": "n1", "stream": "s", "action": "consumer", "consumer": "c",
              "holder": holder, "delivered_seq": 9, "ack_floor": 9, "acked": [],
              "expect": {"delivered_seq": 12, "ack_floor": 11, "acked_count": 0},
              "why": "CONSUMER c", "touches_committed": False}
    return {**action, **changes}


def test_a_consumer_action_sets_the_metadata_copy_or_removes_a_store_copy() -> None:
    n1, n2 = MemoryCopies({}), MemoryCopies({})
    actions = plan(consumer_action("raft", acked=[11]),
                   consumer_action("store", node="n2", delivered_seq=4, ack_floor=3),
                   version=2)
    outcomes = apply_plan(actions, {"n1": n1, "n2": n2}, dry_run=False)
    assert [o.status for o in outcomes] == ["done", "done"]
    assert "Raft index 7" in outcomes[0].detail and "removed n2's store copy" in outcomes[1].detail
    (raft,), (store,) = n1.consumer_requests, n2.consumer_requests
    assert isinstance(raft, cluster_pb2.SetConsumerStateRequest)
    assert (raft.stream, raft.consumer, raft.delivered_seq, raft.ack_floor, list(raft.acked)) == (
        "s", "c", 9, 9, [11])
    assert isinstance(store, replication_pb2.RepairConsumerRequest)
    for request in (raft, store):
        assert (request.expect.delivered_seq, request.expect.ack_floor,
                request.expect.acked_count) == (12, 11, 0)
    assert n1.requests == n2.requests == []  # no record step


def test_a_consumer_action_dry_run_sends_nothing_and_a_refusal_stops_only_its_step() -> None:
    moved = MemoryCopies({}, refuse="n1 SetConsumerState: CONSUMER_CHANGED: it moved")
    n2 = MemoryCopies({})
    actions = plan(consumer_action("raft"), consumer_action("store", node="n2"), version=2)
    dry = apply_plan(actions, {"n1": moved, "n2": n2}, dry_run=True)
    assert [o.status for o in dry] == ["would do", "would do"]
    assert "if it is still at delivered seq 12, ack floor 11" in dry[0].detail
    assert n2.consumer_requests == []
    done = apply_plan(actions, {"n1": moved, "n2": n2}, dry_run=False)
    assert [o.status for o in done] == ["refused", "done"]
    assert "CONSUMER_CHANGED" in done[0].detail


def test_the_metadata_copy_is_set_through_any_member_a_store_copy_only_on_its_node() -> None:
    other = MemoryCopies({})
    actions = plan(consumer_action("raft", node="gone"), consumer_action("store", node="gone"),
                   version=2)
    outcomes = apply_plan(actions, {"n3": other}, dry_run=False)
    assert [o.status for o in outcomes] == ["done", "refused"]
    assert "not a member" in outcomes[1].detail
    assert [type(r) for r in other.consumer_requests] == [cluster_pb2.SetConsumerStateRequest]


def test_a_version_1_plans_consumer_step_stays_manual() -> None:
    target = MemoryCopies({})
    (outcome,) = apply_plan(plan(consumer_action("raft")), {"n1": target}, dry_run=False)
    assert outcome.status == "manual" and "audit again" in outcome.detail
    assert target.consumer_requests == []


@pytest.mark.parametrize("changes, message", [
    ({"consumer": ""}, "consumer must be"),
    ({"holder": "disk"}, "holder must be"),
    ({"ack_floor": -1}, "ack_floor must be"),
    ({"delivered_seq": "9"}, "delivered_seq must be"),
    ({"acked": [3, True]}, "acked must be"),
    ({"expect": None}, "expect must hold"),
    ({"expect": {"delivered_seq": 1, "ack_floor": 1}}, "expect must hold"),
], ids=["consumer", "holder", "floor", "delivered", "acked", "no-expect", "expect-partial"])
def test_a_version_2_consumer_action_is_checked_when_the_plan_is_read(
        changes: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=f"action 1: {message}"):
        plan(consumer_action("raft"), {**consumer_action("raft"), **changes}, version=2)


def test_the_plan_writes_consumer_actions_the_applier_reads() -> None:
    evidence = {"reasons": ["points past the committed end 10"], "delivered_seq": 12,
                "ack_floor": 11, "acked_first": [14], "acked_count": 1, "committed_end": 10,
                "view_node": "n1", "set": {"delivered_seq": 10, "ack_floor": 10, "acked": []}}
    found = [Divergence(stream="s", node="n1", cls=classes.CONSUMER, consumer="c",
                        holder="raft", evidence=evidence),
             Divergence(stream="s", node="n2", cls=classes.CONSUMER, consumer="c",
                        holder="raft", evidence=evidence)]
    written = build_plan(found, input_dir="in", created_ms=1)
    assert written["version"] == repair.PLAN_VERSION == 2
    assert [u["reason"] for u in written["unplanned"]] == [
        "a metadata follower's copy: Raft brings it up to date"]
    (action,) = parse_plan(json.dumps(written))
    assert (action.node, action.fields["holder"], action.fields["ack_floor"]) == ("n1", "raft", 10)
    assert action.fields["expect"] == {"delivered_seq": 12, "ack_floor": 11, "acked_count": 1}


def test_a_consumer_action_without_its_values_refuses_its_step_only() -> None:
    valid = plan(consumer_action("raft"), version=2)[0]
    actions = [Action("n1", "s", "consumer", "CONSUMER c", False,
                      {"consumer": "c", "holder": "raft"}), valid]
    target = MemoryCopies({})
    outcomes = apply_plan(actions, {"n1": target}, dry_run=False)
    assert [o.status for o in outcomes] == ["refused", "done"]
    assert "delivered_seq must be a non-negative integer" in outcomes[0].detail
    assert len(target.consumer_requests) == 1
