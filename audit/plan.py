"""The repair plan: a pure function from the classified divergences to a JSON document.

    {"format": "raftlog-audit-repair-plan", "version": 2, "input": DIR, "created_ms": MS,
     "actions": [ACTION, ...], "unplanned": [{"divergence": LABEL, "reason": TEXT}, ...]}

Every ACTION has "node", "stream", "action", "why" (text naming the divergences it fixes),
"divergences" (those rows: class, first_seq, last_seq) and "touches_committed", plus:
- "truncate": "after_seq" (the committed end) and "expect_last_seq" (the copy's last seq when
  audited: the applier refuses if the copy moved);
- "copy": "from_node", "first_seq", "last_seq": make the copy's seqs equal to the source's;
- "reseed": "from_node": drop the copy and copy the source's whole;
- "consumer": "consumer", "holder", "delivered_seq", "ack_floor", "acked" (the values the copy
  should hold: the metadata's, clamped to the committed end) and "expect" ("delivered_seq",
  "ack_floor", "acked_count": the copy's state when audited; the applier refuses if the
  consumer moved). Holder "raft" is set through the metadata group, holder "store" (a node's
  own store, which a member does not use) is removed. Version 1 had no "expect".

Rules:
- A record committed on a majority is never removed or overwritten, except on a minority copy
  to make it equal to that record (CONTENT / EPOCH with the copy's record held by fewer than a
  majority); such an action has "touches_committed": true and says so in "why".
- A truncation removes only seqs past the committed end (EXTRA_TAIL), and only when every
  listed replica of the stream was exported (else what is committed is not known).
- A source holds the authoritative record over the whole range (the run's `sources`); the
  stream's primary is preferred. With a replica not exported, only records a majority holds are
  copied.
- The primary's copy is never a target (the node serving the stream refuses repairs): its
  divergences are listed as unplanned.
- Per copy: the truncation first, then the copies in seq order (adjacent ranges from one
  source merged); a copy absent from its node is reseeded instead.
- What a plan cannot fix safely is listed under "unplanned" with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from raftlog.audit import classes
from raftlog.audit.divergence import Divergence

PLAN_FORMAT = "raftlog-audit-repair-plan"
PLAN_VERSION = 2  # 2: consumer actions carry "expect"
_COPIED = (classes.HOLE, classes.HEAD, classes.CONTENT, classes.EPOCH)
_OVERWRITES = (classes.CONTENT, classes.EPOCH)

_UNPLANNED_REASON = {
    classes.UNKNOWN_STREAM: "the metadata does not know this stream: remove the copy or "
                            "recreate the stream by hand",
    classes.UNLISTED_REPLICA: "the stream does not list this node: remove the copy by hand "
                              "once the placement is confirmed",
    classes.NOT_EXPORTED: "the node was not exported: export it and audit again",
    classes.META_VIEW: "a metadata follower's view: Raft brings it up to date (if it "
                       "persists, that node's Raft log diverged)",
}


def build_plan(divergences: Iterable[Divergence], *, input_dir: str, created_ms: int
               ) -> dict[str, Any]:
    found = sorted(divergences, key=Divergence.sort_key)
    actions: list[dict[str, Any]] = []
    unplanned: list[dict[str, str]] = []
    per_copy: dict[tuple[str, str], list[Divergence]] = defaultdict(list)
    for item in found:
        if item.cls in classes.RECORD_CLASSES:
            per_copy[(item.stream, item.node)].append(item)
    for (stream, node), items in sorted(per_copy.items()):
        planned, skipped = _copy_actions(stream, node, items)
        actions += planned
        unplanned += skipped
    repaired = {(a["stream"], a["node"]) for a in actions}
    for item in found:
        if item.cls == classes.CONSUMER:
            action, reason = _consumer_action(item)
            if action is not None:
                actions.append(action)
            else:
                unplanned.append(_skip(item, reason))
        elif item.cls == classes.EPOCH_HISTORY:
            unplanned.append(_skip(item, "follows the copy's records: the actions for this copy "
                                   "rewrite them; audit again" if (item.stream, item.node) in
                                   repaired else "the copy's records agree but its epochs "
                                   "list does not: needs an operator"))
        elif item.cls in _UNPLANNED_REASON:
            unplanned.append(_skip(item, _UNPLANNED_REASON[item.cls]))
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "input": input_dir,
            "created_ms": created_ms, "actions": actions, "unplanned": unplanned}


def _copy_actions(stream: str, node: str, items: list[Divergence]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    if any(item.evidence.get("primary") == node for item in items):
        return [], [_skip(item, "the node is the stream's primary, whose copy a repair does "
                          "not rewrite: move the primary (a failover), then audit again")
                    for item in items]
    if any(item.evidence.get("has_copy") is False for item in items):
        return _reseed(stream, node, items)
    actions: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    tails = [item for item in items if item.cls == classes.EXTRA_TAIL]
    if tails and any(item.evidence.get("incomplete") for item in tails):
        skipped += [_skip(item, "a replica of the stream was not exported: what is committed "
                          "is not known, nothing is truncated") for item in tails]
    elif tails:
        actions.append(_truncate(stream, node, tails))
    copyable: list[Divergence] = []
    for item in items:
        if item.cls not in _COPIED:
            continue
        reason = _why_not_copied(item)
        if reason:
            skipped.append(_skip(item, reason))
        else:
            copyable.append(item)
    actions += [_copy(stream, node, group) for group in _merged(copyable)]
    return actions, skipped


def _why_not_copied(item: Divergence) -> str:
    evidence = item.evidence
    majority = evidence.get("majority") or 0
    if not item.sources:
        return "no replica holds an authoritative record for these seqs"
    if item.cls in _OVERWRITES and (evidence.get("votes") or 0) >= majority:
        return "the copy's record is held by a majority: it is not overwritten by a plan"
    if evidence.get("incomplete") and (evidence.get("authority_votes") or 0) < majority:
        return ("a replica of the stream was not exported and no majority holds the "
                "authoritative record: nothing is copied")
    return ""


def _source(item: Divergence) -> str:
    primary = item.evidence.get("primary")
    return primary if primary in item.sources else sorted(item.sources)[0]


def _merged(items: Sequence[Divergence]) -> list[list[Divergence]]:
    groups: list[list[Divergence]] = []
    for item in sorted(items, key=lambda d: d.first_seq or 0):
        if groups and _source(groups[-1][-1]) == _source(item) and \
                (groups[-1][-1].last_seq or 0) + 1 == item.first_seq:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _copy(stream: str, node: str, group: list[Divergence]) -> dict[str, Any]:
    overwrites = any(item.cls in _OVERWRITES for item in group)
    return _action(node, stream, "copy", group, touches_committed=overwrites,
                   from_node=_source(group[0]), first_seq=group[0].first_seq,
                   last_seq=group[-1].last_seq)


def _truncate(stream: str, node: str, tails: list[Divergence]) -> dict[str, Any]:
    evidence = tails[0].evidence
    return _action(node, stream, "truncate", tails, touches_committed=False,
                   after_seq=evidence.get("committed_end", 0),
                   expect_last_seq=evidence.get("copy_last_seq"))


def _reseed(stream: str, node: str, items: list[Divergence]
            ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    common = set.intersection(*(set(item.sources) for item in items))
    if not common:
        return [], [_skip(item, "the copy is absent and no single replica holds every "
                          "authoritative record: needs an operator") for item in items]
    primary = items[0].evidence.get("primary")
    source = primary if primary in common else sorted(common)[0]
    return [_action(node, stream, "reseed", items, touches_committed=False,
                    from_node=source)], []


def _consumer_action(item: Divergence) -> tuple[dict[str, Any] | None, str]:
    values = item.evidence.get("set")
    if not values:
        return None, "the metadata holds no state for this consumer: needs an operator"
    if item.holder == "raft" and item.node != item.evidence.get("view_node"):
        return None, "a metadata follower's copy: Raft brings it up to date"
    evidence = item.evidence
    expect = {"delivered_seq": int(evidence.get("delivered_seq") or 0),
              "ack_floor": int(evidence.get("ack_floor") or 0),
              "acked_count": int(evidence.get("acked_count") or 0)}
    action = _action(item.node, item.stream, "consumer", [item], touches_committed=False,
                     consumer=item.consumer, holder=item.holder, **values, expect=expect)
    return action, ""


def _action(node: str, stream: str, kind: str, items: Sequence[Divergence], *,
            touches_committed: bool, **fields: Any) -> dict[str, Any]:
    return {"node": node, "stream": stream, "action": kind, **fields,
            "why": "; ".join(_reason(item) for item in items),
            "divergences": [{"class": item.cls, "first_seq": item.first_seq,
                             "last_seq": item.last_seq} for item in items],
            "touches_committed": touches_committed}


def _reason(item: Divergence) -> str:
    evidence, span = item.evidence, item.span()
    votes, majority = evidence.get("votes"), evidence.get("majority")
    held = f"held by {evidence.get('authority_votes')} of the replicas ({', '.join(item.sources)})"
    if item.cls == classes.HOLE:
        return f"HOLE {span}: the copy lacks records {held}"
    if item.cls == classes.HEAD:
        return (f"HEAD {span}: the copy's head {evidence.get('copy_first_seq')} is above the "
                f"authoritative head {evidence.get('head')}; the records are {held}")
    if item.cls in _OVERWRITES:
        what = "digest" if item.cls == classes.CONTENT else "epoch"
        return (f"{item.cls} {span}: a minority copy ({votes} of a majority of {majority}) "
                f"differs in {what} from the committed record {held}; made equal to it")
    if item.cls == classes.EXTRA_TAIL:
        return (f"EXTRA_TAIL {span}: uncommitted tail past the committed end "
                f"{evidence.get('committed_end')}")
    reasons = ", ".join(evidence.get("reasons") or ())
    return f"CONSUMER {item.consumer} ({item.holder}): {reasons}"


def _skip(item: Divergence, reason: str) -> dict[str, str]:
    return {"divergence": item.label(), "reason": reason}
