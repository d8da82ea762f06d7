"""The metadata state machine (raftlog.raft.state): one table test per rule, named after it, and
a hypothesis state machine that drives random command sequences and checks the invariants after
every step (reproduce a failure with the seed hypothesis prints)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftlog.base import limits
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft import commands as c
from raftlog.raft import state as sm
from raftlog.raft import state_consumers, state_members, state_rules, state_streams
from raftlog.raft.api import ensure_ok
from raftlog.raft.state import apply
from raftlog.raft.state_model import MetaState, check_invariants
from raftlog.raft.state_snapshot import encode_snapshot, from_snapshot, to_snapshot
from raftlog.v1 import consumers_pb2, types_pb2

NOW_MS = 1_700_000_000_000
ALIVE, SUSPECT, DEAD = (raft_pb2.MEMBER_STATUS_ALIVE, raft_pb2.MEMBER_STATUS_SUSPECT,
                        raft_pb2.MEMBER_STATUS_DEAD)


def join(node_id: str) -> raft_pb2.RaftCommand:
    return c.member_join(node_id=node_id, raft_address=f"raft-{node_id}:1",
                         grpc_address=f"grpc-{node_id}:2", now_ms=NOW_MS)


def create(name: str, replicas: tuple[str, ...] = ("n1", "n2", "n3"), primary: str = "n1",
           **kwargs: int) -> raft_pb2.RaftCommand:
    return c.stream_create(config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"]),
                           replicas=replicas, primary=primary, now_ms=NOW_MS, **kwargs)


def consumer(stream: str, name: str, *, ack_wait_ms: int = 0) -> raft_pb2.RaftCommand:
    return c.consumer_create(stream=stream, config=consumers_pb2.ConsumerConfig(
        name=name, ack_wait_ms=ack_wait_ms))


def progress(stream: str, name: str, *, floor: int = 0, acked: tuple[int, ...] = (),
             delivered: int = 0) -> raft_pb2.RaftCommand:
    return c.consumer_state_update(updates=[c.consumer_progress(
        stream=stream, consumer=name, ack_floor=floor, acked=acked, delivered_seq=delivered)])


def run(state: MetaState, *commands: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    """Applies the commands; every one but the last must succeed."""
    result = raft_pb2.RaftResult(ok=True)
    for index, command in enumerate(commands):
        result = apply(state, command)
        if index < len(commands) - 1:
            ensure_ok(result)
    check_invariants(state)
    return result


def cluster(*extra: raft_pb2.RaftCommand) -> MetaState:
    """Members n1..n4, plus whatever `extra` does (each must succeed)."""
    state = MetaState()
    for command in (join("n1"), join("n2"), join("n3"), join("n4"), *extra):
        ensure_ok(apply(state, command))
    return state


def expect_rejected(state: MetaState, command: raft_pb2.RaftCommand, reason: Reason) -> None:
    """The command is rejected with `reason` and changes nothing."""
    before = to_snapshot(state).SerializeToString()
    result = apply(state, command)
    assert not result.ok, f"accepted: {command}"
    assert result.reason == reason.name, result.message
    assert result.message
    assert to_snapshot(state).SerializeToString() == before
    with pytest.raises(RaftlogError) as raised:
        ensure_ok(result)
    assert raised.value.reason is reason


# Members -----------------------------------------------------------------------------------


def test_member_join_adds_an_alive_member() -> None:
    state = MetaState()
    result = run(state, join("n1"))
    assert result.ok and result.changed
    member = state.members["n1"]
    assert (member.raft_address, member.grpc_address) == ("raft-n1:1", "grpc-n1:2")
    assert (member.status, member.since_ms, member.joined_ms) == (ALIVE, NOW_MS, NOW_MS)


@pytest.mark.parametrize("command", [
    join("n1"),
    c.member_join(node_id="other", raft_address="raft-n1:1", grpc_address="g:9"),
    c.member_join(node_id="other", raft_address="r:9", grpc_address="grpc-n1:2"),
], ids=["same-node-id", "same-raft-address", "same-grpc-address"])
def test_member_join_twice_is_node_exists(command: raft_pb2.RaftCommand) -> None:
    expect_rejected(cluster(), command, Reason.NODE_EXISTS)


@pytest.mark.parametrize("command", [
    c.member_join(node_id="", raft_address="r:1", grpc_address="g:1"),
    c.member_join(node_id="x" * 129, raft_address="r:1", grpc_address="g:1"),
    c.member_join(node_id="n9", raft_address="", grpc_address="g:1"),
    c.member_join(node_id="n9", raft_address="r:1", grpc_address=""),
], ids=["empty-id", "long-id", "no-raft-address", "no-grpc-address"])
def test_member_join_needs_an_id_and_addresses(command: raft_pb2.RaftCommand) -> None:
    expect_rejected(cluster(), command, Reason.INVALID_ARGUMENT)


def test_leaving_an_unknown_node_is_node_not_found() -> None:
    expect_rejected(cluster(), c.member_leave(node_id="n9"), Reason.NODE_NOT_FOUND)


def test_removing_the_last_member_is_last_member() -> None:
    state = MetaState()
    run(state, join("n1"))
    expect_rejected(state, c.member_leave(node_id="n1"), Reason.LAST_MEMBER)


def test_member_leave_removes_a_member_without_streams() -> None:
    state = cluster(create("orders"))
    assert run(state, c.member_leave(node_id="n4")).ok
    assert set(state.members) == {"n1", "n2", "n3"}


def test_a_member_holding_a_stream_cannot_leave() -> None:
    state = cluster(create("orders"))
    expect_rejected(state, c.member_leave(node_id="n2"), Reason.NODE_IN_USE)


def test_member_set_status_records_when_it_changed() -> None:
    state = cluster()
    later = NOW_MS + 5_000
    assert run(state, c.member_set_status(node_id="n2", status=SUSPECT, now_ms=later)).changed
    assert (state.members["n2"].status, state.members["n2"].since_ms) == (SUSPECT, later)
    # The same status again keeps the time it first became true.
    again = run(state, c.member_set_status(node_id="n2", status=SUSPECT, now_ms=later + 9))
    assert again.ok and not again.changed and state.members["n2"].since_ms == later
    run(state, c.member_set_status(node_id="n2", status=DEAD, since_ms=123, now_ms=later))
    assert (state.members["n2"].status, state.members["n2"].since_ms) == (DEAD, 123)


@pytest.mark.parametrize(("command", "reason"), [
    (c.member_set_status(node_id="n9", status=SUSPECT), Reason.NODE_NOT_FOUND),
    (c.member_set_status(node_id="n1", status=raft_pb2.MEMBER_STATUS_UNSPECIFIED),
     Reason.INVALID_ARGUMENT),
], ids=["unknown-node", "unspecified-status"])
def test_member_set_status_rejections(command: raft_pb2.RaftCommand, reason: Reason) -> None:
    expect_rejected(cluster(), command, reason)


def test_members_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_members, "members_max", 4)
    expect_rejected(cluster(), join("n5"), Reason.INVALID_ARGUMENT)


# Streams -----------------------------------------------------------------------------------


def test_stream_names_are_unique() -> None:
    state = cluster(create("orders"))
    expect_rejected(state, create("orders", replicas=("n4",), primary="n4"), Reason.STREAM_EXISTS)


def test_stream_create_assigns_an_id_that_is_never_reused() -> None:
    state = cluster()
    first = run(state, create("orders"))
    assert (first.stream_id, first.fence_epoch) == (1, 1)
    stream = state.streams["orders"]
    assert (stream.primary, stream.replicas) == ("n1", ("n1", "n2", "n3"))
    assert stream.epoch_start_seq == 1
    assert stream.created_ms == NOW_MS and stream.epoch_history == [(1, 1)]
    run(state, c.stream_delete(name="orders"))
    assert run(state, create("orders")).stream_id == 2


def test_stream_create_takes_an_initial_epoch() -> None:
    stream = cluster(create("orders", fence_epoch=7, epoch_start_seq=100)).streams["orders"]
    assert (stream.fence_epoch, stream.epoch_start_seq) == (7, 100)


@pytest.mark.parametrize("name", ["", "a.b", "a b", "x" * 129])
def test_stream_create_rejects_invalid_names(name: str) -> None:
    expect_rejected(cluster(), create(name), Reason.INVALID_NAME)


def test_stream_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_streams, "cluster_streams_max", 1)
    expect_rejected(cluster(create("a")), create("b"), Reason.TOO_MANY_STREAMS)


PLACEMENT_CASES: list[tuple[str, Callable[[], raft_pb2.RaftCommand], Reason]] = [
    ("create-non-member-replica", lambda: create("s", replicas=("n1", "n9")),
     Reason.NODE_NOT_FOUND),
    ("create-primary-not-replica", lambda: create("s", replicas=("n2", "n3"), primary="n1"),
     Reason.INVALID_ARGUMENT),
    ("create-non-member-primary", lambda: create("s", replicas=("n1",), primary="n9"),
     Reason.INVALID_ARGUMENT),
    ("create-no-replicas", lambda: create("s", replicas=()), Reason.INVALID_ARGUMENT),
    ("create-duplicate-replica", lambda: create("s", replicas=("n1", "n1")),
     Reason.INVALID_ARGUMENT),
    ("create-too-many-replicas", lambda: create("s", replicas=tuple(
        f"n{i}" for i in range(1, limits.replicas_max + 2))), Reason.INVALID_ARGUMENT),
    ("update-non-member-replica", lambda: c.stream_update(name="orders", replicas=("n1", "n9")),
     Reason.NODE_NOT_FOUND),
    ("update-drops-the-primary", lambda: c.stream_update(name="orders", replicas=("n2", "n3")),
     Reason.INVALID_ARGUMENT),
    ("promote-non-member", lambda: c.stream_promote(
        stream="orders", new_primary="n9", new_fence_epoch=2, epoch_start_seq=1),
     Reason.NODE_NOT_FOUND),
    ("promote-outside-replicas", lambda: c.stream_promote(
        stream="orders", new_primary="n4", new_fence_epoch=2, epoch_start_seq=1),
     Reason.INVALID_ARGUMENT),
    ("override-non-member", lambda: c.authority_set_override(
        stream="orders", claimant="n9", fence_epoch=2, epoch_start_seq=1),
     Reason.NODE_NOT_FOUND),
    ("override-outside-replicas", lambda: c.authority_set_override(
        stream="orders", claimant="n4", fence_epoch=2, epoch_start_seq=1),
     Reason.INVALID_ARGUMENT),
]


@pytest.mark.parametrize(("command", "reason"), [(make, reason) for _, make, reason in
                                                 PLACEMENT_CASES],
                         ids=[case[0] for case in PLACEMENT_CASES])
def test_a_streams_primary_and_replicas_must_be_members(
        command: Callable[[], raft_pb2.RaftCommand], reason: Reason) -> None:
    state = cluster(create("orders"))
    for i in range(5, limits.replicas_max + 2):
        run(state, join(f"n{i}"))
    expect_rejected(state, command(), reason)


def test_stream_update_replaces_config_and_replicas() -> None:
    state = cluster(create("orders"))
    config = types_pb2.StreamConfig(name="orders", max_msgs=10)
    result = run(state, c.stream_update(name="orders", config=config, replicas=("n1", "n4"),
                                        now_ms=NOW_MS + 1))
    assert result.changed
    stream = state.streams["orders"]
    assert stream.config == config and stream.replicas == ("n1", "n4")
    assert stream.updated_ms == NOW_MS + 1
    assert not run(state, c.stream_update(name="orders", config=config)).changed


@pytest.mark.parametrize(("command", "reason"), [
    (c.stream_update(name="orders", config=types_pb2.StreamConfig(name="other")),
     Reason.IMMUTABLE_FIELD),
    (c.stream_update(name="nope"), Reason.STREAM_NOT_FOUND),
    (c.stream_delete(name="nope"), Reason.STREAM_NOT_FOUND),
    (c.stream_promote(stream="nope", new_primary="n1", new_fence_epoch=2, epoch_start_seq=1),
     Reason.STREAM_NOT_FOUND),
    (c.authority_set_override(stream="nope", claimant="n1", fence_epoch=2, epoch_start_seq=1),
     Reason.STREAM_NOT_FOUND),
    (c.authority_clear_override(stream="nope"), Reason.STREAM_NOT_FOUND),
    (c.authority_set_pinned(stream="nope", pinned=True), Reason.STREAM_NOT_FOUND),
], ids=["rename", "update-unknown", "delete-unknown", "promote-unknown", "override-unknown",
        "clear-unknown", "pin-unknown"])
def test_stream_commands_on_unknown_streams_or_renames(command: raft_pb2.RaftCommand,
                                                       reason: Reason) -> None:
    expect_rejected(cluster(create("orders")), command, reason)


def test_deleting_a_stream_deletes_its_consumers_and_override() -> None:
    state = cluster(create("orders"), consumer("orders", "billing"),
                    c.authority_set_override(stream="orders", claimant="n2", fence_epoch=2,
                                             epoch_start_seq=1, pinned=True))
    run(state, c.stream_delete(name="orders"))
    assert "orders" not in state.streams and "orders" not in state.consumers
    run(state, create("orders"))  # a new stream of that name starts clean
    assert state.streams["orders"].override is None and state.consumers["orders"] == {}


# Fence epochs and authority ----------------------------------------------------------------


@pytest.mark.parametrize(("command", "reason"), [
    (c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=3, epoch_start_seq=5),
     Reason.STALE_EPOCH),
    (c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2, epoch_start_seq=5),
     Reason.STALE_EPOCH),
    (c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=5, epoch_start_seq=5),
     Reason.INVALID_ARGUMENT),
    (c.authority_set_override(stream="orders", claimant="n2", fence_epoch=3, epoch_start_seq=5),
     Reason.STALE_EPOCH),
    (c.authority_set_override(stream="orders", claimant="n2", fence_epoch=1, epoch_start_seq=5),
     Reason.STALE_EPOCH),
], ids=["promote-same-epoch", "promote-older-epoch", "promote-skips-epochs",
        "override-same-epoch", "override-older-epoch"])
def test_fence_epochs_only_grow(command: raft_pb2.RaftCommand, reason: Reason) -> None:
    state = cluster(create("orders", fence_epoch=3, epoch_start_seq=5))
    expect_rejected(state, command, reason)


def test_promote_moves_the_primary_to_the_next_epoch() -> None:
    state = cluster(create("orders", epoch_start_seq=1))
    result = run(state, c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2,
                                         epoch_start_seq=41, replicas=("n2", "n3", "n4")))
    assert (result.fence_epoch, result.stream_id) == (2, 1)
    stream = state.streams["orders"]
    assert (stream.primary, stream.replicas, stream.fence_epoch) == ("n2", ("n2", "n3", "n4"), 2)
    assert stream.epoch_history == [(1, 1), (2, 41)]


def test_epoch_history_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_rules, "epoch_history_max", 3)
    state = cluster(create("orders"))
    for epoch in range(2, 7):
        run(state, c.stream_promote(stream="orders", new_primary="n1", new_fence_epoch=epoch,
                                    epoch_start_seq=epoch))
    assert state.streams["orders"].epoch_history == [(4, 4), (5, 5), (6, 6)]


@pytest.mark.parametrize("command", [
    c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2, epoch_start_seq=9),
    c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2, epoch_start_seq=0),
    c.authority_set_override(stream="orders", claimant="n2", fence_epoch=2, epoch_start_seq=9),
], ids=["promote-below-current-start", "promote-zero", "override-below-current-start"])
def test_epoch_start_seq_never_goes_back(command: raft_pb2.RaftCommand) -> None:
    state = cluster(create("orders", epoch_start_seq=10))
    expect_rejected(state, command, Reason.INVALID_ARGUMENT)


def test_one_authority_per_stream() -> None:
    state = cluster(create("orders"))
    override = run(state, c.authority_set_override(stream="orders", claimant="n2",
                                                   fence_epoch=5, epoch_start_seq=3))
    stream = state.streams["orders"]
    assert override.fence_epoch == 5
    assert stream.primary == "n2" and stream.override is not None
    assert (stream.override.claimant, stream.override.fence_epoch) == ("n2", 5)
    # A newer override replaces the older one: still exactly one authority.
    run(state, c.authority_set_override(stream="orders", claimant="n3", fence_epoch=6,
                                        epoch_start_seq=3))
    assert stream.primary == "n3" and stream.override is not None
    assert stream.override.claimant == "n3"
    # A promote (failover) moves authority and drops the unpinned override with it.
    run(state, c.stream_promote(stream="orders", new_primary="n1", new_fence_epoch=7,
                                epoch_start_seq=3))
    assert stream.primary == "n1" and stream.override is None


def test_clearing_an_override_keeps_the_primary() -> None:
    state = cluster(create("orders"), c.authority_set_override(
        stream="orders", claimant="n2", fence_epoch=2, epoch_start_seq=1))
    assert run(state, c.authority_clear_override(stream="orders")).changed
    stream = state.streams["orders"]
    assert stream.override is None and (stream.primary, stream.fence_epoch) == ("n2", 2)
    assert not run(state, c.authority_clear_override(stream="orders")).changed


def test_pinned_streams_keep_their_override() -> None:
    state = cluster(create("orders"), c.authority_set_override(
        stream="orders", claimant="n2", fence_epoch=2, epoch_start_seq=1, pinned=True))
    expect_rejected(state, c.stream_promote(stream="orders", new_primary="n3", new_fence_epoch=3,
                                            epoch_start_seq=1), Reason.STREAM_PINNED)
    expect_rejected(state, c.authority_clear_override(stream="orders"), Reason.STREAM_PINNED)
    expect_rejected(state, c.authority_set_override(stream="orders", claimant="n3",
                                                    fence_epoch=3, epoch_start_seq=1),
                    Reason.STREAM_PINNED)
    # The claimant itself may move to a new epoch; the override follows it.
    run(state, c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=3,
                                epoch_start_seq=1))
    stream = state.streams["orders"]
    assert stream.override is not None
    assert (stream.override.claimant, stream.override.fence_epoch, stream.override.pinned) == (
        "n2", 3, True)
    # Unpinned, it can be cleared.
    assert run(state, c.authority_set_pinned(stream="orders", pinned=False)).changed
    assert not run(state, c.authority_set_pinned(stream="orders", pinned=False)).changed
    run(state, c.authority_clear_override(stream="orders"))
    assert stream.override is None


def test_pinning_needs_an_override() -> None:
    state = cluster(create("orders"))
    expect_rejected(state, c.authority_set_pinned(stream="orders", pinned=True),
                    Reason.INVALID_ARGUMENT)
    # Unpinning a stream without an override is a no-op (so a retried unpin succeeds).
    unpinned = run(state, c.authority_set_pinned(stream="orders", pinned=False))
    assert unpinned.ok and not unpinned.changed


# Consumers ---------------------------------------------------------------------------------


def test_consumer_create_on_unknown_stream_is_stream_not_found() -> None:
    expect_rejected(cluster(), consumer("nope", "billing"), Reason.STREAM_NOT_FOUND)


def test_consumer_create_is_idempotent_for_the_same_config() -> None:
    state = cluster(create("orders"))
    assert run(state, consumer("orders", "billing", ack_wait_ms=5)).changed
    assert state.consumers["orders"]["billing"].created_ms == 0  # no now_ms in that command
    again = run(state, consumer("orders", "billing", ack_wait_ms=5))
    assert again.ok and not again.changed
    expect_rejected(state, consumer("orders", "billing", ack_wait_ms=6), Reason.CONSUMER_EXISTS)


def test_consumer_create_rejects_invalid_names() -> None:
    expect_rejected(cluster(create("orders")), consumer("orders", "a.b"), Reason.INVALID_NAME)


def test_consumers_per_stream_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_consumers, "consumers_per_stream_max", 2)
    state = cluster(create("orders"), consumer("orders", "a"), consumer("orders", "b"))
    expect_rejected(state, consumer("orders", "c"), Reason.TOO_MANY_CONSUMERS)


@pytest.mark.parametrize(("command", "reason"), [
    (c.consumer_delete(stream="orders", consumer="nope"), Reason.CONSUMER_NOT_FOUND),
    (c.consumer_delete(stream="nope", consumer="billing"), Reason.STREAM_NOT_FOUND),
], ids=["unknown-consumer", "unknown-stream"])
def test_consumer_delete_rejections(command: raft_pb2.RaftCommand, reason: Reason) -> None:
    expect_rejected(cluster(create("orders"), consumer("orders", "billing")), command, reason)


def test_consumer_delete_removes_the_consumer() -> None:
    state = cluster(create("orders"), consumer("orders", "billing"))
    run(state, c.consumer_delete(stream="orders", consumer="billing"))
    assert state.consumers["orders"] == {}


ACK_CASES = [
    # (stored floor, stored acked, update floor, update acked) -> (floor, acked)
    ("lower-floor-ignored-acked-merged", (10, {12}), (5, (14,)), (10, {12, 14})),
    ("floor-advances", (10, {12}), (11, ()), (12, set())),
    ("floor-advances-over-contiguous-acked", (10, {12, 13, 15}), (0, (11,)), (13, {15})),
    ("acked-at-or-below-floor-dropped", (10, set()), (0, (3, 10, 11)), (11, set())),
    ("higher-floor-drops-acked-below-it", (10, {12, 20}), (15, (16,)), (16, {20})),
]


@pytest.mark.parametrize(("stored", "update", "expected"),
                         [case[1:] for case in ACK_CASES], ids=[case[0] for case in ACK_CASES])
def test_ack_floors_never_go_backwards(stored: tuple[int, set[int]],
                                       update: tuple[int, tuple[int, ...]],
                                       expected: tuple[int, set[int]]) -> None:
    state = cluster(create("orders"), consumer("orders", "billing"))
    entry = state.consumers["orders"]["billing"]
    entry.ack_floor, entry.acked = stored[0], set(stored[1])
    result = run(state, progress("orders", "billing", floor=update[0], acked=update[1]))
    assert result.updates_applied == 1 and not result.skipped
    assert (entry.ack_floor, entry.acked) == expected


def test_delivered_seq_never_goes_backwards() -> None:
    state = cluster(create("orders"), consumer("orders", "billing"))
    run(state, progress("orders", "billing", delivered=9))
    result = run(state, progress("orders", "billing", delivered=4))
    assert state.consumers["orders"]["billing"].delivered_seq == 9 and not result.changed


def test_consumer_state_update_skips_unknown_consumers_and_applies_the_rest() -> None:
    state = cluster(create("orders"), consumer("orders", "billing"))
    result = run(state, c.consumer_state_update(updates=[
        c.consumer_progress(stream="gone", consumer="billing", ack_floor=3),
        c.consumer_progress(stream="orders", consumer="gone", ack_floor=3),
        c.consumer_progress(stream="orders", consumer="billing", ack_floor=3),
    ]))
    assert result.ok and result.changed and result.updates_applied == 1
    assert [(s.stream, s.consumer, s.reason) for s in result.skipped] == [
        ("gone", "billing", "STREAM_NOT_FOUND"), ("orders", "gone", "CONSUMER_NOT_FOUND")]
    assert state.consumers["orders"]["billing"].ack_floor == 3


def test_consumer_progress_from_an_older_epoch_is_skipped() -> None:
    """A deposed primary cannot commit acks the new primary did not load (G5)."""
    state = cluster(create("orders"), consumer("orders", "billing"),
                    c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2,
                                     epoch_start_seq=5))

    def update(epoch: int) -> raft_pb2.RaftResult:
        return run(state, c.consumer_state_update(updates=[c.consumer_progress(
            stream="orders", consumer="billing", ack_floor=9, fence_epoch=epoch)]))

    assert [s.reason for s in update(1).skipped] == ["STALE_EPOCH"]
    assert state.consumers["orders"]["billing"].ack_floor == 0
    assert update(2).updates_applied == 1
    assert update(0).updates_applied == 1  # 0 = not checked
    assert state.consumers["orders"]["billing"].ack_floor == 9


def test_acked_above_floor_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_consumers, "acked_above_floor_max", 2)
    state = cluster(create("orders"), consumer("orders", "billing"),
                    progress("orders", "billing", acked=(5, 7)))
    result = run(state, progress("orders", "billing", acked=(9,)))
    assert result.updates_applied == 0 and result.skipped[0].reason == "OVERLOADED"
    assert state.consumers["orders"]["billing"].acked == {5, 7}


def test_consumer_updates_per_command_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_consumers, "consumer_updates_max", 1)
    command = c.consumer_state_update(updates=[
        c.consumer_progress(stream="orders", consumer="billing")] * 2)
    expect_rejected(cluster(create("orders"), consumer("orders", "billing")), command,
                    Reason.BATCH_TOO_LARGE)


# An operator's set of one consumer's progress (ConsumerStateSet) -----------------------------


def set_state(stream: str = "orders", name: str = "billing", *, floor: int = 0,
              acked: tuple[int, ...] = (), delivered: int = 0, commit_seq: int = 100,
              epoch: int = 0, expect: tuple[int, int, int] | None = None
              ) -> raft_pb2.RaftCommand:
    """`expect`: (delivered seq, ack floor, acked count) the consumer must still have."""
    return c.consumer_state_set(
        stream=stream, consumer=name, ack_floor=floor, acked=acked, delivered_seq=delivered,
        commit_seq=commit_seq, fence_epoch=epoch,
        expect=None if expect is None else consumers_pb2.ConsumerStateExpect(
            delivered_seq=expect[0], ack_floor=expect[1], acked_count=expect[2]))


def progressed() -> MetaState:
    """orders/billing at delivered seq 40, ack floor 30, acked {33, 35}."""
    return cluster(create("orders"), consumer("orders", "billing"),
                   progress("orders", "billing", floor=30, acked=(33, 35), delivered=40))


def held(state: MetaState) -> tuple[int, int, set[int]]:
    entry = state.consumers["orders"]["billing"]
    return entry.delivered_seq, entry.ack_floor, entry.acked


def test_a_consumer_state_set_replaces_the_progress_and_may_lower_the_floor() -> None:
    state = progressed()
    result = run(state, set_state(floor=10, acked=(12,), delivered=20, commit_seq=20))
    assert result.ok and result.changed
    assert held(state) == (20, 10, {12})
    # Progress merges from the new values on, as before: floors never go back from there.
    run(state, progress("orders", "billing", floor=5, acked=(11,)))
    assert held(state) == (20, 12, set())


SET_NORMALISED = [
    # (floor, acked) asked -> (floor, acked) held
    ("acked-at-or-below-the-floor-dropped", (10, (3, 10, 14)), (10, {14})),
    ("floor-moves-over-acked-seqs-that-follow-it", (10, (11, 12, 14)), (12, {14})),
]


@pytest.mark.parametrize(("asked", "expected"), [case[1:] for case in SET_NORMALISED],
                         ids=[case[0] for case in SET_NORMALISED])
def test_a_consumer_state_set_is_normalised_as_a_merge_would_leave_it(
        asked: tuple[int, tuple[int, ...]], expected: tuple[int, set[int]]) -> None:
    state = progressed()
    run(state, set_state(floor=asked[0], acked=asked[1], delivered=20))
    assert held(state)[1:] == expected


@pytest.mark.parametrize("command", [
    set_state(floor=21, delivered=21, commit_seq=20),
    set_state(floor=5, delivered=21, commit_seq=20),
    set_state(floor=5, acked=(7, 21), delivered=10, commit_seq=20),
    set_state(floor=1, commit_seq=0),
], ids=["floor", "delivered-seq", "acked-seq", "empty-stream"])
def test_a_consumer_state_set_never_points_past_the_committed_end(
        command: raft_pb2.RaftCommand) -> None:
    expect_rejected(progressed(), command, Reason.PAST_COMMITTED_END)


def test_a_consumer_state_set_with_an_expected_state_applies_only_while_it_holds() -> None:
    state = progressed()
    for moved in ((41, 30, 2), (40, 31, 2), (40, 30, 1)):
        expect_rejected(state, set_state(floor=5, delivered=5, expect=moved),
                        Reason.CONSUMER_CHANGED)
    assert run(state, set_state(floor=5, delivered=5, expect=(40, 30, 2))).changed
    expect_rejected(state, set_state(floor=5, delivered=5, expect=(40, 30, 2)),
                    Reason.CONSUMER_CHANGED)  # the same repair again: it moved (by the first)


def test_a_consumer_state_set_from_a_replaced_primary_is_stale_epoch() -> None:
    state = cluster(create("orders"), consumer("orders", "billing"),
                    c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2,
                                     epoch_start_seq=5))
    expect_rejected(state, set_state(floor=3, delivered=3, epoch=1), Reason.STALE_EPOCH)
    assert run(state, set_state(floor=3, delivered=3, epoch=2)).changed
    assert run(state, set_state(floor=4, delivered=4, epoch=0)).changed  # 0 = not checked


@pytest.mark.parametrize(("command", "reason"), [
    (set_state(stream="nope"), Reason.STREAM_NOT_FOUND),
    (set_state(name="nope"), Reason.CONSUMER_NOT_FOUND),
], ids=["unknown-stream", "unknown-consumer"])
def test_a_consumer_state_set_needs_the_stream_and_the_consumer(
        command: raft_pb2.RaftCommand, reason: Reason) -> None:
    expect_rejected(progressed(), command, reason)


def test_a_consumer_state_set_of_the_values_held_changes_nothing() -> None:
    state = progressed()
    result = run(state, set_state(floor=30, acked=(33, 35), delivered=40))
    assert result.ok and not result.changed and held(state) == (40, 30, {33, 35})


def test_a_consumer_state_sets_acked_seqs_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_consumers, "acked_above_floor_max", 2)
    expect_rejected(progressed(), set_state(floor=1, acked=(3, 5, 7), delivered=9),
                    Reason.INVALID_ARGUMENT)


def test_a_consumer_state_set_drops_the_consumers_encoded_snapshot_record() -> None:
    state = progressed()
    encode_snapshot(state)
    assert ("orders", "billing") in state.encoded_consumers
    run(state, set_state(floor=3, delivered=3))
    assert ("orders", "billing") not in state.encoded_consumers
    assert encode_snapshot(state) == to_snapshot(state).SerializeToString()


# The machine as a whole --------------------------------------------------------------------


def test_an_empty_command_is_rejected() -> None:
    expect_rejected(cluster(), raft_pb2.RaftCommand(now_ms=NOW_MS), Reason.INVALID_ARGUMENT)


def test_barrier_changes_nothing() -> None:
    state = cluster(create("orders"))
    before = to_snapshot(state)
    result = run(state, c.barrier())
    assert result.ok and not result.changed and to_snapshot(state) == before


def test_time_comes_from_the_command() -> None:
    state = cluster()
    run(state, create("orders"))
    assert state.streams["orders"].created_ms == NOW_MS
    run(state, c.member_set_status(node_id="n3", status=DEAD, now_ms=42))
    assert state.members["n3"].since_ms == 42


def full_state() -> MetaState:
    return cluster(
        create("orders"), create("audit", replicas=("n4",), primary="n4"),
        c.authority_set_override(stream="orders", claimant="n3", fence_epoch=4,
                                 epoch_start_seq=2, pinned=True),
        consumer("orders", "billing", ack_wait_ms=100), consumer("orders", "ship"),
        progress("orders", "billing", floor=5, acked=(9, 7), delivered=12),
        c.member_set_status(node_id="n2", status=SUSPECT, now_ms=77),
    )


def test_snapshot_round_trip_equals_the_state() -> None:
    state = full_state()
    snapshot = to_snapshot(state)
    assert from_snapshot(raft_pb2.RaftSnapshot.FromString(snapshot.SerializeToString())) == state
    assert [s.name for s in snapshot.streams] == ["audit", "orders"]
    assert list(snapshot.consumers[0].acked) == [7, 9]


def test_encode_snapshot_reencodes_only_what_changed() -> None:
    state = full_state()
    first = encode_snapshot(state)
    assert first == to_snapshot(state).SerializeToString()
    cached = dict(state.encoded_streams)
    run(state, c.stream_update(name="audit", replicas=("n4", "n1")),
        progress("orders", "billing", floor=20))
    assert state.encoded_streams.keys() == {"orders"} and cached["orders"] is \
        state.encoded_streams["orders"]
    assert ("orders", "billing") not in state.encoded_consumers
    assert encode_snapshot(state) == to_snapshot(state).SerializeToString() != first
    assert encode_snapshot(state, last_applied_index=99) == to_snapshot(
        dataclasses.replace(state, applied_index=99)).SerializeToString()


def test_apply_is_deterministic() -> None:
    assert to_snapshot(full_state()).SerializeToString() == \
        to_snapshot(full_state()).SerializeToString()


@pytest.mark.parametrize("breakage", [
    lambda s: setattr(s.streams["orders"], "primary", "n4"),
    lambda s: setattr(s.streams["orders"], "replicas", ("n3", "n9")),
    lambda s: setattr(s.streams["audit"], "fence_epoch", 0),
    lambda s: s.consumers["orders"]["billing"].acked.add(3),
    lambda s: s.consumers.setdefault("ghost", {}).update(x=s.consumers["orders"]["billing"]),
], ids=["override-not-primary", "replica-not-member", "epoch-zero", "acked-below-floor",
        "consumers-of-missing-stream"])
def test_from_snapshot_refuses_a_state_that_breaks_a_rule(
        breakage: Callable[[MetaState], object]) -> None:
    state = full_state()
    breakage(state)
    with pytest.raises(InvariantViolation):
        from_snapshot(to_snapshot(state))


# Random command sequences ------------------------------------------------------------------

NODES = ("n1", "n2", "n3", "n4", "n5")
STREAMS = ("s1", "s2", "s3")
CONSUMERS = ("c1", "c2")
nodes = st.sampled_from(NODES)
streams = st.sampled_from(STREAMS)
picks = st.lists(st.integers(0, 9), min_size=1, max_size=4)


class MetaStateMachine(RuleBasedStateMachine):
    """Random commands, most of them rejected; the invariants hold after every step and a
    rejected command never changes anything."""

    def __init__(self) -> None:
        super().__init__()
        self.state = MetaState()
        self.now_ms = NOW_MS
        self.epochs: dict[int, int] = {}  # stream id -> highest epoch seen
        self.floors: dict[tuple[int, str], int] = {}  # (stream id, consumer) -> highest floor

    @initialize(streams_made=st.integers(0, len(STREAMS)))
    def start(self, streams_made: int) -> None:
        """Three members and some streams, so that most rules find something to act on."""
        for node in NODES[:3]:
            ensure_ok(self.do(join(node)))
        for name in STREAMS[:streams_made]:
            ensure_ok(self.do(create(name)))

    def do(self, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
        self.now_ms += 1
        command.now_ms = self.now_ms
        before = to_snapshot(self.state).SerializeToString()
        result = apply(self.state, command)
        if not result.ok:
            assert to_snapshot(self.state).SerializeToString() == before, result
        return result

    @rule(node=nodes)
    def member_join(self, node: str) -> None:
        self.do(join(node))

    @rule(node=nodes)
    def member_leave(self, node: str) -> None:
        self.do(c.member_leave(node_id=node))

    @rule(node=nodes, status=st.sampled_from((ALIVE, SUSPECT, DEAD)))
    def member_set_status(self, node: str, status: raft_pb2.MemberStatus.ValueType) -> None:
        self.do(c.member_set_status(node_id=node, status=status))

    def members(self, picks: list[int]) -> tuple[str, ...]:
        """Distinct current members chosen by `picks` (an unknown node when there is none)."""
        pool = sorted(self.state.members) or ["n9"]
        return tuple(dict.fromkeys(pool[pick % len(pool)] for pick in picks))

    def stream(self, name: str) -> tuple[int, int, tuple[str, ...]]:
        """(epoch, epoch start seq, replicas) of the stream, made up when it does not exist."""
        stream = self.state.streams.get(name)
        if stream is None:
            return 1, 1, ("n1",)
        return stream.fence_epoch, stream.epoch_start_seq, stream.replicas

    @rule(name=streams, picks=picks, primary=st.integers(0, 9), stray=st.booleans())
    def stream_create(self, name: str, picks: list[int], primary: int, stray: bool) -> None:
        replicas = self.members(picks)
        chosen = "n9" if stray else replicas[primary % len(replicas)]
        self.do(create(name, replicas=replicas, primary=chosen))

    @rule(name=streams, picks=picks)
    def stream_update(self, name: str, picks: list[int]) -> None:
        self.do(c.stream_update(name=name, replicas=self.members(picks)))

    @rule(name=streams)
    def stream_delete(self, name: str) -> None:
        self.do(c.stream_delete(name=name))

    @rule(name=streams, primary=st.integers(0, 9), delta=st.integers(-1, 2),
          start_delta=st.integers(-1, 5), picks=st.one_of(st.just([]), picks))
    def stream_promote(self, name: str, primary: int, delta: int, start_delta: int,
                       picks: list[int]) -> None:
        epoch, start, replicas = self.stream(name)
        new_replicas = self.members(picks) if picks else ()
        candidates = new_replicas or replicas
        self.do(c.stream_promote(stream=name, new_primary=candidates[primary % len(candidates)],
                                 new_fence_epoch=max(0, epoch + delta),
                                 epoch_start_seq=max(0, start + start_delta),
                                 replicas=new_replicas))

    @rule(name=streams, claimant=st.integers(0, 9), delta=st.integers(-1, 3),
          start_delta=st.integers(-1, 5), pinned=st.booleans())
    def authority_set_override(self, name: str, claimant: int, delta: int, start_delta: int,
                               pinned: bool) -> None:
        epoch, start, replicas = self.stream(name)
        self.do(c.authority_set_override(
            stream=name, claimant=replicas[claimant % len(replicas)], pinned=pinned,
            fence_epoch=max(0, epoch + delta), epoch_start_seq=max(0, start + start_delta)))

    @rule(name=streams)
    def authority_clear_override(self, name: str) -> None:
        self.do(c.authority_clear_override(stream=name))

    @rule(name=streams, pinned=st.booleans())
    def authority_set_pinned(self, name: str, pinned: bool) -> None:
        self.do(c.authority_set_pinned(stream=name, pinned=pinned))

    @rule(name=streams, consumer_name=st.sampled_from(CONSUMERS))
    def consumer_create(self, name: str, consumer_name: str) -> None:
        self.do(consumer(name, consumer_name))

    @rule(name=streams, consumer_name=st.sampled_from(CONSUMERS))
    def consumer_delete(self, name: str, consumer_name: str) -> None:
        self.do(c.consumer_delete(stream=name, consumer=consumer_name))
        stream = self.state.streams.get(name)
        if stream is not None and consumer_name not in self.state.consumers.get(name, {}):
            # A consumer created again under the same name starts afresh.
            self.floors.pop((stream.stream_id, consumer_name), None)

    @rule(name=streams, consumer_name=st.sampled_from(CONSUMERS), floor=st.integers(0, 30),
          acked=st.lists(st.integers(0, 40), max_size=6), delivered=st.integers(0, 50),
          epoch_offset=st.sampled_from((None, -1, 0)))
    def consumer_progress(self, name: str, consumer_name: str, floor: int, acked: list[int],
                          delivered: int, epoch_offset: int | None) -> None:
        epoch = 0 if epoch_offset is None else max(0, self.stream(name)[0] + epoch_offset)
        self.do(c.consumer_state_update(updates=[c.consumer_progress(
            stream=name, consumer=consumer_name, ack_floor=floor, acked=acked,
            delivered_seq=delivered, fence_epoch=epoch)]))

    @rule(name=streams, consumer_name=st.sampled_from(CONSUMERS), floor=st.integers(0, 30),
          acked=st.lists(st.integers(0, 40), max_size=6), delivered=st.integers(0, 50),
          commit_seq=st.integers(0, 40), expect=st.booleans())
    def consumer_state_set(self, name: str, consumer_name: str, floor: int, acked: list[int],
                           delivered: int, commit_seq: int, expect: bool) -> None:
        entry = self.state.consumers.get(name, {}).get(consumer_name)
        seen = consumers_pb2.ConsumerStateExpect(
            delivered_seq=entry.delivered_seq, ack_floor=entry.ack_floor,
            acked_count=len(entry.acked)) if entry is not None and expect else None
        result = self.do(c.consumer_state_set(
            stream=name, consumer=consumer_name, ack_floor=floor, acked=acked,
            delivered_seq=delivered, commit_seq=commit_seq, expect=seen))
        if result.ok:  # the one command a floor goes down by
            held = self.state.consumers[name][consumer_name]
            assert max(held.ack_floor, held.delivered_seq, *held.acked) <= commit_seq
            self.floors[(self.state.streams[name].stream_id, consumer_name)] = held.ack_floor

    @invariant()
    def rules_hold(self) -> None:
        check_invariants(self.state)  # one authority, members, floors above acked, ...

    @invariant()
    def epochs_only_grow(self) -> None:
        for stream in self.state.streams.values():
            assert stream.fence_epoch >= self.epochs.get(stream.stream_id, 0)
            self.epochs[stream.stream_id] = stream.fence_epoch

    @invariant()
    def ack_floors_are_monotonic(self) -> None:
        for name, consumers in self.state.consumers.items():
            stream_id = self.state.streams[name].stream_id
            for consumer_name, entry in consumers.items():
                key = (stream_id, consumer_name)
                assert entry.ack_floor >= self.floors.get(key, 0)
                self.floors[key] = entry.ack_floor

    @invariant()
    def snapshot_round_trip_equals_state(self) -> None:
        snapshot = to_snapshot(self.state)
        encoded = snapshot.SerializeToString()
        # The cached encoding matches one from scratch: apply dropped every record it changed.
        assert encode_snapshot(self.state) == encoded
        restored = from_snapshot(raft_pb2.RaftSnapshot.FromString(encoded))
        assert restored == self.state
        assert encode_snapshot(restored) == encoded


MetaStateMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40,
                                              deadline=None)
test_meta_state_machine = MetaStateMachine.TestCase



def test_failover_promotes_are_chunked_by_size_and_by_count() -> None:
    from raftlog.node.cluster.failover import _chunks
    from raftlog.raft.api import encode_command
    from raftlog.raft.state_model import promotes_max

    short = [raft_pb2.StreamPromote(stream=f"s{k}", new_primary="n1", new_fence_epoch=2,
                                    epoch_start_seq=1, replicas=["n1", "n2", "n3"])
             for k in range(2 * promotes_max + 5)]
    long = [raft_pb2.StreamPromote(stream="x" * 120 + str(k), new_primary="n1",
                                   new_fence_epoch=2, epoch_start_seq=1,
                                   replicas=["n1", "n2", "n3"]) for k in range(1000)]
    for promotes in (short, long):
        chunks = _chunks(promotes)
        assert [p for chunk in chunks for p in chunk] == promotes
        for chunk in chunks:
            assert len(chunk) <= promotes_max
            command = raft_pb2.RaftCommand(stream_promotes=raft_pb2.StreamPromotes(
                promotes=chunk))
            assert command.ByteSize() <= limits.failover_promote_batch_bytes_max + 4096
            encode_command(command)  # within the Raft command size limit


def test_stream_promotes_apply_each_promote_on_its_own() -> None:
    state = MetaState()
    for node in ("n1", "n2", "n3"):
        ensure_ok(sm.apply(state, c.member_join(node_id=node, raft_address=f"{node}:1",
                                                grpc_address=f"{node}:2", now_ms=1)))
    for name in ("a", "b"):
        ensure_ok(sm.apply(state, c.stream_create(
            config=types_pb2.StreamConfig(name=name), replicas=["n1", "n2", "n3"],
            primary="n1", now_ms=1)))
    result = sm.apply(state, c.stream_promotes(promotes=[
        raft_pb2.StreamPromote(stream="a", new_primary="n2", new_fence_epoch=2,
                               epoch_start_seq=5),
        raft_pb2.StreamPromote(stream="b", new_primary="n2", new_fence_epoch=7,
                               epoch_start_seq=5),  # not epoch + 1: rejected, alone
        raft_pb2.StreamPromote(stream="gone", new_primary="n2", new_fence_epoch=2,
                               epoch_start_seq=1),
    ], now_ms=2))
    assert result.ok and result.updates_applied == 1
    assert [(s.stream, s.reason) for s in result.skipped] == [
        ("b", "INVALID_ARGUMENT"), ("gone", "STREAM_NOT_FOUND")]
    assert (state.streams["a"].primary, state.streams["a"].fence_epoch) == ("n2", 2)
    assert (state.streams["b"].primary, state.streams["b"].fence_epoch) == ("n1", 1)
    assert state.streams_led_by("n2") == ["a"] and state.streams_led_by("n1") == ["b"]
    check_invariants(state)


def test_the_caps_apply_enforces_are_the_ones_nodes_check_first() -> None:
    """raft/ owns the caps its state machine enforces (base/limits.py cannot be imported into a
    replicated rule without making a node setting part of the protocol); a node checks the
    same values before it proposes, so a client sees the same error either way."""
    from raftlog.base import limits
    from raftlog.raft import state_model

    for name in ("replicas_max", "consumers_per_stream_max", "acked_above_floor_max"):
        assert getattr(state_model, name) == getattr(limits, name), name


def test_a_node_can_hold_a_copy_of_every_stream_its_cluster_may_have() -> None:
    """Two caps, two meanings: the cluster's stream count is a rule of the state machine
    (state_model.cluster_streams_max), a node's own count of copies a node setting
    (limits.streams_per_node_max). With replicas >= members every node holds every stream, so a
    node must be able to hold as many copies as the cluster may have streams."""
    from raftlog.base import limits
    from raftlog.raft import state_model

    assert limits.streams_per_node_max >= state_model.cluster_streams_max


def test_a_replica_accepts_every_epoch_history_the_metadata_keeps() -> None:
    """A primary sends its stream's epoch history from the metadata (at most
    state_model.epoch_history_max pairs) in every batch; a replica refuses a batch with more than
    limits.replication_history_entries_max, so that bound is never below the metadata's."""
    from raftlog.base import limits
    from raftlog.raft import state_model

    assert limits.replication_history_entries_max >= state_model.epoch_history_max
