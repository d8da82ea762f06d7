"""Changing a stream's replica set one node at a time, and the rule that makes each change
safe: pure functions that node/cluster/placement.py feeds with what it asked the replicas.

Why one node at a time: a message is committed once a majority of the replica set holds it
(node/replication/primary.py), and failover promotes the most complete copy among a fenced majority
(node/cluster/failover.py). Adding or removing a single node keeps every majority of the old set
overlapping every majority of the new one, so what a majority of the old set committed while
the change was in flight is still found by a failover of the new set. Two changes at once (a
swap) do not keep that overlap, so a replacement is an addition followed by a removal.

Why a check as well: right after an addition the newcomer holds nothing, and what was
committed before is on a majority of the old set only. So a change is made only when every
majority of the NEW set contains a node holding everything the primary held when asked
(`is_safe`): at the stream's current fence epoch and at or past the primary's last seq.

What to change (`next_replicas`), in order:
1. a replica on a node that is no longer a member: remove it;
2. a replica on a silent member, when a spare can replace it or enough healthy replicas
   remain: remove it first (while it is in the set, the commit rule would count on it, so
   adding the spare first would stall writes until the spare caught up); a silent replica with
   no spare to replace it stays (a smaller set would need a larger share of it alive);
3. fewer healthy replicas than wanted and an alive spare member: add the best spare (ring
   order);
4. a replica on a member that is leaving (it still answers, so it is replaced before it goes):
   remove it;
5. more replicas than wanted: remove the one most behind (no answer counts as furthest
   behind; among equals, the one last in ring order).
The primary is never removed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from raftlog.internal import replication_pb2


@dataclass(frozen=True)
class Position:
    """Where one copy stands (GetReplicaState)."""

    epoch: int
    last_seq: int


@dataclass(frozen=True)
class Shape:
    """What placement knows about one stream's replica set, without asking any node."""

    replicas: tuple[str, ...]
    primary: str
    wanted: int  # replicas the stream should have (its config, capped by the members)
    healthy: frozenset[str]  # replicas on members that answer and are not leaving
    leaving: frozenset[str]  # replicas on members that answer and are leaving
    gone: frozenset[str]  # replicas on nodes that are no longer members
    spares: tuple[str, ...]  # alive members outside the set that may join, best first
    ring: tuple[str, ...] = ()  # members in the stream's ring order (ties in removals)


def majority(count: int) -> int:
    return count // 2 + 1


def is_safe(new: Collection[str], holders: Collection[str]) -> bool:
    """Every majority of `new` contains a holder: more holders than `new` has nodes outside
    some majority."""
    inside = len(set(new) & set(holders))
    return inside > len(new) - majority(len(new))


def holders(positions: Mapping[str, Position | None], *, primary: str,
            fence_epoch: int) -> set[str]:
    """The copies holding everything the primary held when asked (ask the primary first):
    at `fence_epoch` and at or past its last seq. Empty when the primary did not answer."""
    lead = positions.get(primary)
    if lead is None:
        return set()
    return {primary} | {node for node, at in positions.items()
                        if at is not None and at.epoch == fence_epoch
                        and at.last_seq >= lead.last_seq}


def next_replicas(shape: Shape, positions: Mapping[str, Position | None] | None = None
                  ) -> tuple[str, ...] | None:
    """The replica set after the next single change, or None when none is due. Without
    `positions` a removal picks by what `shape` says alone (enough to tell whether a change
    is due)."""
    replicas, primary = shape.replicas, shape.primary
    healthy = [n for n in replicas if n in shape.healthy or n == primary]
    others = [n for n in replicas if n != primary]
    gone = [n for n in others if n in shape.gone]
    silent = [n for n in others if n not in healthy and n not in shape.leaving]
    leaving = [n for n in others if n in shape.leaving]
    if gone:
        return _without(replicas, gone[0])
    if silent and (shape.spares or len(healthy) >= shape.wanted):
        return _without(replicas, silent[0])
    if len(healthy) < shape.wanted and shape.spares:
        return (*replicas, shape.spares[0])
    if leaving:
        return _without(replicas, leaving[0])
    if len(replicas) > shape.wanted:
        rank = {node: index for index, node in enumerate(shape.ring)}
        candidates = sorted(others, key=lambda n: rank.get(n, len(rank)))
        return _without(replicas, most_behind(candidates, positions or {}))
    return None


def most_behind(candidates: Sequence[str], positions: Mapping[str, Position | None]) -> str:
    """The candidate furthest behind (no answer counts as furthest); among equals, the last
    in `candidates` order."""
    def behind(index: int) -> tuple[int, int, int]:
        at = positions.get(candidates[index])
        return (-1, -1, -index) if at is None else (at.epoch, at.last_seq, -index)
    return candidates[min(range(len(candidates)), key=behind)]


def _without(replicas: Sequence[str], node: str) -> tuple[str, ...]:
    return tuple(n for n in replicas if n != node)


def completeness(state: replication_pb2.ReplicaState) -> tuple[int, int]:
    """How complete a copy is: (the epoch its last message was written in, its last seq),
    compared as Raft compares (last term, last index). A copy that merely heard of a newer
    epoch (a probe) is not more complete than a longer one: comparing the epoch it follows
    could promote a shorter copy over one holding committed messages."""
    return state.last_epoch, state.last_seq


def most_complete(states: Iterable[replication_pb2.ReplicaState]
                  ) -> replication_pb2.ReplicaState:
    """Of a fenced majority's copies, the one that holds every committed message."""
    return max(states, key=completeness)
