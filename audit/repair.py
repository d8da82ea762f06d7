"""Applying an audit's repair plan to a running cluster (`raftlog audit repair --plan FILE`).

A plan (written by `raftlog audit run`) is a list of actions, each on one node's copy of one
stream, each saying why and whether it touches a record committed on a majority:

    truncate  remove the copy's messages above `after_seq`
    copy      store seqs [first_seq, last_seq] as `from_node` holds them (holes filled,
              differing records replaced), read from `from_node`'s copy
    reseed    drop the copy; the stream's primary re-sends it from its head
    consumer  consumer state that disagrees: holder "raft" (the metadata's copy) is set to the
              plan's values through the metadata group (`Cluster.SetConsumerState`, served
              by the stream's primary), holder "store" (a node's own consumer store, which a
              member does not use) is removed (`Replication.RepairConsumer`)

A record step goes through the node's peer listener (the Replication service's `Repair` and
`ReadLocal`, signed with the cluster credential), and is refused by a node that serves the
stream as its primary or whose copy moved since the export (the plan's `expect_last_seq`). A
consumer step names the state the consumer had when audited (`expect`) and is refused when the
consumer moved since (CONSUMER_CHANGED), or when a value lies past the stream's commit seq
(PAST_COMMITTED_END). A refused step changes nothing and the run goes on with the next. Dry run
by default: each step is shown (a record step with the copy's current state) and nothing is
changed.

Plan versions: 2 adds `expect` to consumer actions. A version 1 plan is still read: its record
steps apply as before and its consumer steps stay `manual` (it does not say what the consumer
held when audited, so applying it could overwrite newer progress).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raftlog.audit.peers import PeerError
from raftlog.internal import replication_pb2
from raftlog.v1 import cluster_pb2, consumers_pb2

PLAN_FORMAT = "raftlog-audit-repair-plan"
PLAN_VERSION = 2
PLAN_VERSIONS = (1, 2)  # the versions this raftlog applies (see the module docstring)
ACTIONS = ("truncate", "copy", "reseed", "consumer")
HOLDERS = ("raft", "store")  # a consumer action's copies (audit/export_rows.py)
_EXPECT_FIELDS = ("delivered_seq", "ack_floor", "acked_count")
put_messages_max = 1_000  # messages per Repair(put) call
put_bytes_max = 4 * 1024 * 1024  # stored bytes per Repair(put) call (one message at least)


class PlanError(ValueError):
    """The plan file is not a repair plan this version can apply."""


@dataclass(frozen=True)
class Action:
    node: str
    stream: str
    action: str
    why: str
    touches_committed: bool
    fields: dict[str, Any] = field(default_factory=dict)
    plan_version: int = PLAN_VERSION

    def int_field(self, name: str) -> int:
        value = self.fields.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PlanError(f"{self.describe()}: {name} must be a non-negative integer")
        return value

    def optional_int(self, name: str) -> int | None:
        return None if self.fields.get(name) is None else self.int_field(name)

    def describe(self) -> str:
        if self.action == "truncate":
            what = f"truncate after seq {self.fields.get('after_seq')}"
        elif self.action == "copy":
            what = (f"copy seqs [{self.fields.get('first_seq')}, {self.fields.get('last_seq')}]"
                    f" from {self.fields.get('from_node')}")
        elif self.action == "reseed":
            what = f"re-seed from {self.fields.get('from_node') or 'the primary'}"
        elif self.fields.get("holder") == "store":
            what = f"consumer {self.fields.get('consumer')!r}: remove the node's store copy"
        else:
            what = (f"consumer {self.fields.get('consumer')!r}: set delivered seq "
                    f"{self.fields.get('delivered_seq')}, ack floor "
                    f"{self.fields.get('ack_floor')}, {len(self.fields.get('acked') or ())} "
                    "acked (the metadata's copy)")
        return f"{self.node} {self.stream!r}: {what}"


def load_plan(path: Path) -> list[Action]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read a plan: {exc}") from None
    return parse_plan(text, origin=str(path))


def parse_plan(text: str, *, origin: str = "plan") -> list[Action]:
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{origin}: cannot read a plan: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != PLAN_FORMAT:
        raise PlanError(f"{origin}: not a raftlog audit repair plan")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in PLAN_VERSIONS:
        raise PlanError(f"{origin}: plan version {version!r}; this raftlog applies versions "
                        f"{', '.join(map(str, PLAN_VERSIONS))}")
    actions = raw.get("actions")
    if not isinstance(actions, list):
        raise PlanError(f"{origin}: 'actions' must be a list")
    parsed = [_action(item, index, version=version) for index, item in enumerate(actions)]
    for index, action in enumerate(parsed):
        if action.action == "consumer" and version >= 2:
            check_consumer(action, where=f"action {index}")
    return parsed


def check_consumer(action: Action, *, where: str) -> None:
    """A version 2 consumer action: its consumer, holder, values and expected state; PlanError
    (starting with `where`) otherwise."""
    fields = action.fields

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    consumer = fields.get("consumer")
    if not isinstance(consumer, str) or not consumer:
        raise PlanError(f"{where}: consumer must be a non-empty string")
    if fields.get("holder") not in HOLDERS:
        raise PlanError(f"{where}: holder must be one of {', '.join(HOLDERS)}")
    for name in ("delivered_seq", "ack_floor"):
        if not count(fields.get(name)):
            raise PlanError(f"{where}: {name} must be a non-negative integer")
    acked = fields.get("acked", [])
    if not isinstance(acked, list) or not all(count(seq) for seq in acked):
        raise PlanError(f"{where}: acked must be a list of non-negative integers")
    expect = fields.get("expect")
    if not isinstance(expect, dict) or not all(count(expect.get(name))
                                               for name in _EXPECT_FIELDS):
        raise PlanError(f"{where}: expect must hold {', '.join(_EXPECT_FIELDS)} as "
                        "non-negative integers (the consumer's state when audited)")


def _action(item: Any, index: int, *, version: int) -> Action:
    if not isinstance(item, dict):
        raise PlanError(f"action {index}: not an object")
    node, stream, kind = item.get("node"), item.get("stream"), item.get("action")
    if not isinstance(node, str) or not node or not isinstance(stream, str) or not stream:
        raise PlanError(f"action {index}: node and stream must be non-empty strings")
    if kind not in ACTIONS:
        raise PlanError(f"action {index}: unknown action {kind!r} (known: {', '.join(ACTIONS)})")
    why = item.get("why", "")
    rest = {key: value for key, value in item.items()
            if key not in ("node", "stream", "action", "why", "touches_committed")}
    return Action(node, stream, str(kind), why if isinstance(why, str) else json.dumps(why),
                  bool(item.get("touches_committed", False)), rest, version)


class CopyAccess(Protocol):
    """One node's copies, as a repair reaches them (audit/peers.py `PeerNode` over gRPC)."""

    def state(self, stream: str) -> replication_pb2.ReplicaState: ...

    def read(self, stream: str, first_seq: int, last_seq: int
             ) -> Iterator[replication_pb2.LocalMessage]: ...

    def repair(self, request: replication_pb2.RepairRequest) -> replication_pb2.RepairReply: ...

    def repair_consumer(self, request: replication_pb2.RepairConsumerRequest
                        ) -> replication_pb2.RepairConsumerReply:
        """The node's own consumer store (holder "store")."""
        ...

    def set_consumer_state(self, request: cluster_pb2.SetConsumerStateRequest
                           ) -> cluster_pb2.SetConsumerStateResponse:
        """The metadata's copy (holder "raft"), through any member: it goes to the stream's
        primary."""
        ...


@dataclass
class Outcome:
    action: Action
    status: str  # "would do" (dry run), "done", "refused", "manual" (a version 1 consumer step)
    detail: str


def apply_plan(actions: list[Action], nodes: Mapping[str, CopyAccess], *, dry_run: bool,
               report: Callable[[Outcome], None] = lambda _: None) -> list[Outcome]:
    """Each action in order; `nodes` by node id. Returns (and reports) one outcome each."""
    outcomes = []
    for action in actions:
        outcome = _apply(action, nodes, dry_run=dry_run)
        report(outcome)
        outcomes.append(outcome)
    return outcomes


def _apply(action: Action, nodes: Mapping[str, CopyAccess], *, dry_run: bool) -> Outcome:
    if action.action == "consumer":
        return _apply_consumer(action, nodes, dry_run=dry_run)
    target = nodes.get(action.node)
    if target is None:
        return Outcome(action, "refused", f"{action.node} is not a member of the cluster")
    try:
        state = target.state(action.stream)
        where = (f"copy now [{state.first_seq}, {state.last_seq}] epoch {state.epoch}"
                 f"{', serving as primary' if state.serving else ''}")
        if dry_run:
            return Outcome(action, "would do", where)
        changed = _perform(action, target, nodes)
    except (PeerError, PlanError) as exc:
        return Outcome(action, "refused", str(exc))
    return Outcome(action, "done", f"{changed} messages changed; was {where}")


def _apply_consumer(action: Action, nodes: Mapping[str, CopyAccess], *, dry_run: bool
                    ) -> Outcome:
    if action.plan_version < 2:
        return Outcome(action, "manual", "a version 1 plan does not say what the consumer held "
                       "when audited: audit again for a plan that applies it; " + action.why)
    try:
        check_consumer(action, where=action.describe())
    except PlanError as exc:
        return Outcome(action, "refused", str(exc))
    fields, holder = action.fields, action.fields["holder"]
    target = nodes.get(action.node)
    if target is None and holder == "raft" and nodes:  # any member forwards it to the primary
        target = nodes[sorted(nodes)[0]]
    if target is None:
        return Outcome(action, "refused", f"{action.node} is not a member of the cluster")
    expect = consumers_pb2.ConsumerStateExpect(**{name: fields["expect"][name]
                                                  for name in _EXPECT_FIELDS})
    seen = (f"if it is still at delivered seq {expect.delivered_seq}, ack floor "
            f"{expect.ack_floor}, {expect.acked_count} acked")
    if dry_run:
        what = ("set through the metadata group (by the stream's primary)" if holder == "raft"
                else f"remove {action.node}'s store copy (a member serves consumers from the "
                "metadata's copy)")
        return Outcome(action, "would do", f"{what}, {seen}")
    try:
        detail = _send_consumer(action, target, expect)
    except PeerError as exc:
        return Outcome(action, "refused", str(exc))
    return Outcome(action, "done", detail)


def _send_consumer(action: Action, target: CopyAccess,
                   expect: consumers_pb2.ConsumerStateExpect) -> str:
    """Applies a checked consumer action through `target`; what happened, in words."""
    fields = action.fields
    if fields["holder"] == "raft":
        reply = target.set_consumer_state(cluster_pb2.SetConsumerStateRequest(
            stream=action.stream, consumer=fields["consumer"],
            delivered_seq=fields["delivered_seq"], ack_floor=fields["ack_floor"],
            acked=fields.get("acked", []), expect=expect))
        if not reply.changed:
            return "the metadata already held these values"
        return (f"committed at Raft index {reply.raft_index} (the stream's commit seq "
                f"{reply.commit_seq})")
    removed = target.repair_consumer(replication_pb2.RepairConsumerRequest(
        stream=action.stream, consumer=fields["consumer"], expect=expect)).changed
    return (f"removed {action.node}'s store copy" if removed
            else f"{action.node}'s store holds no copy any more")


def _perform(action: Action, target: CopyAccess, nodes: Mapping[str, CopyAccess]) -> int:
    def request() -> replication_pb2.RepairRequest:
        made = replication_pb2.RepairRequest(stream=action.stream)
        expect = action.optional_int("expect_last_seq")
        if expect is not None:
            made.expect_last_seq = expect
        return made

    if action.action == "truncate":
        step = request()
        step.truncate_after = action.int_field("after_seq")
        return target.repair(step).changed
    source = nodes.get(str(action.fields.get("from_node", "")))
    if action.action == "reseed":
        step = request()
        step.reset_to = max(source.state(action.stream).first_seq if source else 1, 1)
        return target.repair(step).changed
    if source is None:
        raise PlanError(f"{action.describe()}: from_node is not a member of the cluster")
    first, last = action.int_field("first_seq"), action.int_field("last_seq")
    changed = 0
    for chunk in _chunks(source.read(action.stream, first, last)):
        step = request()
        step.put.messages.extend(chunk)
        changed += target.repair(step).changed
    return changed


def _chunks(messages: Iterator[replication_pb2.LocalMessage]
            ) -> Iterator[list[replication_pb2.LocalMessage]]:
    chunk: list[replication_pb2.LocalMessage] = []
    size = 0
    for message in messages:
        if chunk and (len(chunk) >= put_messages_max or size + len(message.stored) > put_bytes_max):
            yield chunk
            chunk, size = [], 0
        chunk.append(message)
        size += len(message.stored)
    if chunk:
        yield chunk
