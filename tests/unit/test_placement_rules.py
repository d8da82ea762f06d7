"""Placement rules without processes: the replica-set change rule (node/cluster/replica_sets.py,
table driven) and migrations that fail midway (node/cluster/placement.py over the in-memory metadata
group and scripted replica answers): the stream always ends with a serving primary."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.clock import SystemClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.cluster.placement import Placement
from raftlog.node.cluster.replica_sets import Position, Shape, holders, is_safe, next_replicas
from raftlog.raft.memory import MemoryRaftGroup
from raftlog.v1 import types_pb2

# --------------------------------------------------------------------------- replica_sets


@pytest.mark.parametrize(("new", "holding", "safe"), [
    (("p",), {"p"}, True),
    (("p", "a"), {"p"}, True),  # adding to a settled R1
    (("p", "a", "b"), {"p"}, False),  # a second addition before the first caught up
    (("p", "a", "b"), {"p", "a"}, True),
    (("p", "a", "b", "c"), {"p", "a"}, True),  # R3 -> R4: any 3 of 4 meet 2 holders
    (("p", "a", "b", "c"), {"p"}, False),
    (("p", "a"), set(), False),  # the primary did not answer
    (("p", "b"), {"p", "a"}, True),  # removing a holder from R3 keeps one in every pair
])
def test_a_change_is_safe_only_when_every_majority_of_the_new_set_holds_the_prefix(
    new: tuple[str, ...], holding: set[str], safe: bool,
) -> None:
    assert is_safe(new, holding) is safe


def test_holders_are_at_the_current_epoch_and_at_or_past_the_primarys_last_seq() -> None:
    positions: dict[str, Position | None] = {
        "p": Position(3, 100), "a": Position(3, 100), "b": Position(2, 120),
        "c": Position(3, 99), "d": None}
    assert holders(positions, primary="p", fence_epoch=3) == {"p", "a"}
    assert holders({**positions, "p": None}, primary="p", fence_epoch=3) == set()


def shape(replicas: tuple[str, ...], *, wanted: int, silent: str = "", leaving: str = "",
          gone: str = "", spares: tuple[str, ...] = (), primary: str = "p") -> Shape:
    """A shape whose replicas answer unless named `silent`, `leaving` or `gone` (one letter
    per node)."""
    healthy = frozenset(replicas) - set(silent) - set(leaving) - set(gone)
    return Shape(replicas=replicas, primary=primary, wanted=wanted, healthy=healthy,
                 leaving=frozenset(leaving), gone=frozenset(gone), spares=spares,
                 ring=("p", "a", "b", "c", "d", "x"))


@pytest.mark.parametrize(("given", "positions", "expected"), [
    (shape(("p", "a", "b"), wanted=3), None, None),
    (shape(("p",), wanted=3, spares=("a", "b")), None, ("p", "a")),  # one at a time
    (shape(("p", "a", "b"), wanted=1), {"a": Position(1, 9), "b": Position(1, 5)},
     ("p", "a")),  # the copy most behind leaves
    (shape(("p", "a", "b"), wanted=2), {"a": None, "b": Position(1, 5)}, ("p", "b")),
    (shape(("p", "a", "b"), wanted=2), {"a": Position(1, 5), "b": Position(1, 5)},
     ("p", "a")),  # equal: the one last in ring order leaves
    (shape(("p", "a"), wanted=1, primary="a"), {"p": Position(2, 1)}, ("a",)),
    # A leaving member still answers: its replacement is added first, then it goes.
    (shape(("p", "a", "x"), wanted=3, leaving="x", spares=("b",)), None, ("p", "a", "x", "b")),
    (shape(("p", "a", "x", "b"), wanted=3, leaving="x"), None, ("p", "a", "b")),
    (shape(("p", "a", "x"), wanted=2, leaving="x"), None, ("p", "a")),  # no spare
    # A silent member is taken out first (the commit rule would wait for it), then replaced.
    (shape(("p", "a", "x"), wanted=3, silent="x", spares=("b",)), None, ("p", "a")),
    (shape(("p", "a"), wanted=3, spares=("b",)), None, ("p", "a", "b")),
    (shape(("p", "a", "x"), wanted=3, silent="x"), None, None),  # no spare: it stays
    (shape(("p", "a", "x", "b"), wanted=3, silent="x"), None, ("p", "a", "b")),
    (shape(("p", "a", "x"), wanted=3, gone="x"), None, ("p", "a")),  # not a member: out
    (shape(("p", "a", "b"), wanted=1, silent="p"), None, ("p", "a")),  # never the primary
])
def test_the_next_replica_set_change(given: Shape, positions: dict[str, Position | None] | None,
                                     expected: tuple[str, ...] | None) -> None:
    assert next_replicas(given, positions) == expected


# --------------------------------------------------------------------------- migrations


@dataclass
class Copy:
    """What one node answers about the stream: reads, and (separately) fences."""

    last_seq: int
    epoch: int = 1
    commit_seq: int = 0
    answers_reads: bool = True
    answers_fences: bool = True
    fenced_at: int = 0


@dataclass
class ScriptedPeers:
    """Stands in for PeerClient: answers GetReplicaState from `copies`."""

    copies: dict[str, Copy]
    on_fence: Callable[[str], None] = lambda node: None

    async def replica_state(self, node_id: str, stream: str, *, fence_epoch: int = 0,
                            timeout_s: float) -> replication_pb2.ReplicaState:
        copy = self.copies[node_id]
        if not (copy.answers_fences if fence_epoch else copy.answers_reads):
            raise RaftlogError(Reason.TIMEOUT, f"{node_id} does not answer")
        if fence_epoch:
            copy.fenced_at = max(copy.fenced_at, fence_epoch)
            self.on_fence(node_id)
        await asyncio.sleep(0)
        return replication_pb2.ReplicaState(
            stream=stream, node_id=node_id, exists=True, epoch=copy.epoch,
            last_seq=copy.last_seq, commit_seq=copy.commit_seq)


class AllAlive:
    def silent_s(self, node_id: str) -> float:
        return 0.0


async def cluster_with(group: MemoryRaftGroup, *, replicas: tuple[str, ...],
                       stream_replicas: int) -> None:
    for node in ("n1", "n2", "n3"):
        await group.propose(raft_pb2.RaftCommand(member_join=raft_pb2.MemberJoin(
            node_id=node, raft_address=f"127.0.0.1:{7000 + int(node[1])}",
            grpc_address=f"127.0.0.1:{8000 + int(node[1])}")), timeout_s=1)
    await group.propose(raft_pb2.RaftCommand(stream_create=raft_pb2.StreamCreate(
        config=types_pb2.StreamConfig(name="s", replicas=stream_replicas), replicas=replicas,
        primary=replicas[0])), timeout_s=1)


def run_migrate(copies: dict[str, Copy], *, replicas: tuple[str, ...], target: str,
                on_fence: Callable[[str], None] = lambda node: None,
                wrap: Callable[[Placement], None] = lambda p: None
                ) -> tuple[MemoryRaftGroup, RaftlogError | None, Any]:
    async def main() -> tuple[MemoryRaftGroup, RaftlogError | None, Any]:
        group = MemoryRaftGroup()
        await cluster_with(group, replicas=replicas, stream_replicas=len(replicas))
        peers = ScriptedPeers(copies, on_fence=on_fence)
        placement = Placement(node_id="n1", group=group, peers=peers,  # type: ignore[arg-type]
                              liveness=AllAlive(), clock=SystemClock())  # type: ignore[arg-type]
        wrap(placement)
        try:
            answer = await placement.migrate("s", target)
        except RaftlogError as err:
            return group, err, None
        return group, None, answer
    return asyncio.run(main())


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "move_target_silent_s_max", 0.3)
    monkeypatch.setattr(limits, "move_handover_catch_up_s", 0.3)
    monkeypatch.setattr(limits, "placement_step_timeout_s", 0.5)
    monkeypatch.setattr(limits, "move_settle_timeout_s", 0.5)


def test_a_single_replica_stream_moves_and_the_old_copy_leaves() -> None:
    copies = {"n1": Copy(last_seq=10, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=0)}
    group, error, answer = run_migrate(copies, replicas=("n1",), target="n2")
    assert error is None
    stream = group.state.streams["s"]
    assert (stream.primary, stream.replicas, stream.fence_epoch) == ("n2", ("n2",), 2)
    assert (answer.fence_epoch, answer.epoch_start_seq) == (2, 11)


def test_fences_that_reach_a_minority_give_the_stream_back_to_its_old_primary() -> None:
    copies = {"n1": Copy(last_seq=10, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=9)}
    copies["n2"].answers_fences = copies["n3"].answers_fences = False
    group, error, _ = run_migrate(copies, replicas=("n1", "n2", "n3"), target="n2")
    assert error is not None and error.reason is Reason.NO_QUORUM
    stream = group.state.streams["s"]
    assert (stream.primary, stream.fence_epoch, stream.epoch_start_seq) == ("n1", 2, 11)


def test_a_target_that_stops_during_the_handover_leaves_the_most_complete_copy_leading(
) -> None:
    copies = {"n1": Copy(last_seq=12, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=11)}

    def target_stops(node: str) -> None:  # once the old primary is fenced
        if node == "n1":
            copies["n2"].answers_reads = copies["n2"].answers_fences = False

    group, error, _ = run_migrate(copies, replicas=("n1", "n2", "n3"), target="n2",
                                  on_fence=target_stops)
    assert error is not None and error.reason is Reason.NODE_UNREACHABLE
    stream = group.state.streams["s"]
    assert (stream.primary, stream.fence_epoch, stream.epoch_start_seq) == ("n1", 2, 13)


def test_an_override_that_does_not_commit_gives_the_stream_back_to_its_old_primary() -> None:
    copies = {"n1": Copy(last_seq=10, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=10)}

    def refuse_overrides(placement: Placement) -> None:
        propose = placement._propose

        async def failing(command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
            if command.HasField("authority_set_override"):
                raise RaftlogError(Reason.NO_LEADER, "lost Raft leadership")
            return await propose(command)
        placement._propose = failing  # type: ignore[method-assign]

    group, error, _ = run_migrate(copies, replicas=("n1", "n2", "n3"), target="n2",
                                  wrap=refuse_overrides)
    assert error is not None and error.reason is Reason.NO_LEADER
    stream = group.state.streams["s"]
    assert (stream.primary, stream.fence_epoch, stream.epoch_start_seq) == ("n1", 2, 11)


def test_a_target_added_for_the_move_is_taken_out_again_when_it_stops_answering() -> None:
    copies = {"n1": Copy(last_seq=10, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=0, answers_reads=False, answers_fences=False)}
    fenced: list[str] = []
    group, error, _ = run_migrate(copies, replicas=("n1", "n2"), target="n3",
                                  on_fence=fenced.append)
    assert error is not None and error.reason is Reason.NODE_UNREACHABLE
    stream = group.state.streams["s"]
    assert (stream.primary, stream.replicas, stream.fence_epoch) == ("n1", ("n1", "n2"), 1)
    assert fenced == []


def test_nothing_is_fenced_when_a_majority_does_not_answer_first() -> None:
    copies = {"n1": Copy(last_seq=10, commit_seq=10), "n2": Copy(last_seq=10),
              "n3": Copy(last_seq=10, answers_reads=False)}
    fenced: list[str] = []
    copies["n3"].answers_fences = False

    def stop_reads(placement: Placement) -> None:  # n2 answers the catch-up, then goes quiet
        wait = placement._wait_caught_up

        async def then_silent(stream: str, target: str) -> None:
            await wait(stream, target)
            copies["n2"].answers_reads = copies["n2"].answers_fences = False
        placement._wait_caught_up = then_silent  # type: ignore[method-assign]

    group, error, _ = run_migrate(copies, replicas=("n1", "n2", "n3"), target="n2",
                                  on_fence=fenced.append, wrap=stop_reads)
    assert error is not None and error.reason is Reason.NO_QUORUM
    assert fenced == []
    stream = group.state.streams["s"]
    assert (stream.primary, stream.fence_epoch) == ("n1", 1)
