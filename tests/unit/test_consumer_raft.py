"""RaftConsumerStore (node/consumers/raft_store.py): consumer state committed through the metadata
group, coalesced into few commands, and resumed by a new primary after failover (G5).

In-memory twins throughout (MemoryRaftGroup, MemoryStreamLog, FakeClock); async tests run with
`asyncio.run` through `run_async`. Each test is named after the rule it checks.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, storage_pb2
from raftlog.node.consumers import raft_store as consumer_raft
from raftlog.node.consumers.config import validate_config
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import (
    RaftConsumerStore,
    build_commands,
    record_from_assignment,
)
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.engine.log import MemoryStreamLog
from raftlog.raft import commands as c
from raftlog.raft.api import ensure_ok
from raftlog.raft.memory import MemoryRaftGroup
from raftlog.raft.state_model import ConsumerAssignment
from raftlog.v1 import consumers_pb2, types_pb2
from tests.async_tests import run_async

STREAM = "orders"
NODE = "n1"
LIMITS = types_pb2.RETENTION_POLICY_LIMITS
ACK_WAIT_S = limits.ack_wait_ms_default / 1000


class RecordingGroup(MemoryRaftGroup):
    """A MemoryRaftGroup that records every proposal and can hold proposals at a gate."""

    def __init__(self, *, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self.commands: list[raft_pb2.RaftCommand] = []
        self.gate: asyncio.Event | None = None  # proposals wait for it when set

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        self.commands.append(command)
        if self.gate is not None:
            await self.gate.wait()
        return await super().propose(command, timeout_s=timeout_s)

    def state_updates(self) -> list[raft_pb2.ConsumerStateUpdate]:
        return [command.consumer_state_update for command in self.commands
                if command.WhichOneof("command") == "consumer_state_update"]


@dataclass
class Env:
    group: RecordingGroup
    store: RaftConsumerStore
    clock: FakeClock

    def assignment(self, name: str = "c") -> ConsumerAssignment:
        return self.group.state.consumers[STREAM][name]

    async def create(self, name: str, **fields: Any) -> consumers_pb2.ConsumerConfig:
        cfg = config(name, **fields)
        ensure_ok(await self.group.propose(c.consumer_create(stream=STREAM, config=cfg),
                                           timeout_s=1))
        return cfg


async def setup(*consumers: str, **store_options: Any) -> Env:
    """A metadata group holding one member, the stream and `consumers`; nothing recorded yet."""
    clock = FakeClock()
    group = RecordingGroup(clock=clock)
    env = Env(group=group, store=RaftConsumerStore(group=group, clock=clock, **store_options),
              clock=clock)
    ensure_ok(await group.propose(c.member_join(node_id=NODE, raft_address="127.0.0.1:7000",
                                                grpc_address="127.0.0.1:8000"), timeout_s=1))
    ensure_ok(await group.propose(c.stream_create(
        config=types_pb2.StreamConfig(name=STREAM, subjects=["a", "b"]), replicas=[NODE],
        primary=NODE), timeout_s=1))
    for name in consumers:
        await env.create(name)
    group.commands.clear()
    return env


def config(name: str, **fields: Any) -> consumers_pb2.ConsumerConfig:
    return validate_config(consumers_pb2.ConsumerConfig(name=name, **fields),
                           stream_subjects=("a", "b"))


def record(name: str = "c", *, floor: int = 0, acked: tuple[int, ...] | range = (),
           delivered: int = 0) -> storage_pb2.ConsumerRecord:
    return storage_pb2.ConsumerRecord(config=config(name), ack_floor=floor, acked=list(acked),
                                      delivered_seq=max(delivered, floor, *acked, 0))


async def raises(reason: Reason, awaitable: Any) -> RaftlogError:
    with pytest.raises(RaftlogError) as caught:
        await awaitable
    assert caught.value.reason == reason, caught.value
    return caught.value


async def until(predicate: Callable[[], bool], *, timeout_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < give_up_at, "condition not reached"
        await asyncio.sleep(0.001)


# --------------------------------------------------------------------------- save


@run_async
async def test_batches_pipeline_up_to_the_bound_and_saves_wait_for_their_own_commit() -> None:
    names = [f"c{i}" for i in range(8)]
    env = await setup(*names, coalesce_ms=0)
    env.group.gate = asyncio.Event()  # nothing commits until the gate opens
    saves = []
    for name in names:  # one save per loop turn: each may start a batch of its own
        saves.append(asyncio.ensure_future(env.store.save(STREAM, record(name, floor=2))))
        await asyncio.sleep(0)
    await until(lambda: len(env.group.commands) == limits.consumer_batches_inflight_max)
    await asyncio.sleep(0.01)
    assert len(env.group.commands) == limits.consumer_batches_inflight_max  # the bound holds
    assert not any(save.done() for save in saves)  # none is told "saved" before its commit
    env.group.gate.set()
    await asyncio.gather(*saves)
    # The saves that waited went out together once a batch ended.
    assert len(env.group.commands) <= limits.consumer_batches_inflight_max + 4
    assert all(env.assignment(name).ack_floor == 2 for name in names)


@run_async
async def test_concurrent_saves_go_out_as_one_command() -> None:
    names = [f"c{i}" for i in range(20)]
    env = await setup(*names)
    saves = [env.store.save(STREAM, record(name, floor=3)) for name in names]
    saves.append(env.store.save(STREAM, record("c0", floor=5, acked=(7,))))  # merged into c0's
    await asyncio.gather(*saves)
    (update,) = env.group.state_updates()
    assert sorted(p.consumer for p in update.updates) == sorted(names)
    assert [(a.ack_floor, a.acked) for a in map(env.assignment, names[1:])] == [(3, set())] * 19
    assert (env.assignment("c0").ack_floor, env.assignment("c0").acked) == (5, {7})


@run_async
async def test_saves_within_the_coalescing_window_share_one_command() -> None:
    names = [f"c{i}" for i in range(5)]
    env = await setup(*names, coalesce_ms=200)
    saves = []
    for name in names:  # arriving one by one, 5 ms apart
        saves.append(asyncio.create_task(env.store.save(STREAM, record(name, floor=1))))
        await asyncio.sleep(0.005)
    assert env.group.state_updates() == [] and not any(save.done() for save in saves)
    await asyncio.gather(*saves)
    (update,) = env.group.state_updates()
    assert len(update.updates) == len(names)


@run_async
async def test_a_later_save_of_a_pending_consumer_merges_like_the_state_machine() -> None:
    env = await setup("c", coalesce_ms=50)
    await asyncio.gather(env.store.save(STREAM, record(floor=2, acked=(9,), delivered=9)),
                         env.store.save(STREAM, record(floor=4, acked=(6,), delivered=6)))
    (update,) = env.group.state_updates()
    (progress,) = update.updates
    assert (progress.ack_floor, list(progress.acked), progress.delivered_seq) == (4, [6, 9], 9)
    assert (env.assignment().ack_floor, env.assignment().acked) == (4, {6, 9})


@run_async
async def test_save_returns_only_after_its_command_committed() -> None:
    env = await setup("c")
    env.group.gate = asyncio.Event()
    task = asyncio.create_task(env.store.save(STREAM, record(floor=5)))
    await until(lambda: len(env.group.state_updates()) == 1)  # proposed, held at the gate
    await asyncio.sleep(0.02)
    assert not task.done()
    assert env.assignment().ack_floor == 0
    env.group.gate.set()
    await task
    assert env.assignment().ack_floor == 5


@run_async
async def test_a_save_arriving_while_a_batch_is_in_flight_waits_for_its_own_commit() -> None:
    env = await setup("c")
    env.group.gate = asyncio.Event()
    first = asyncio.create_task(env.store.save(STREAM, record(floor=3)))
    await until(lambda: len(env.group.state_updates()) == 1)
    second = asyncio.create_task(env.store.save(STREAM, record(floor=7)))
    await asyncio.sleep(0.02)
    assert not first.done() and not second.done()
    env.group.gate.set()
    await first
    await second
    assert [u.updates[0].ack_floor for u in env.group.state_updates()] == [3, 7]
    assert env.assignment().ack_floor == 7


@run_async
async def test_a_proposal_failure_fails_every_save_of_the_batch() -> None:
    names = [f"c{i}" for i in range(5)]
    env = await setup(*names)
    env.group.set_leader(False)
    outcomes = await asyncio.gather(*(env.store.save(STREAM, record(name, floor=2))
                                      for name in names), return_exceptions=True)
    assert all(isinstance(o, RaftlogError) and o.reason == Reason.NO_LEADER for o in outcomes)
    assert all(env.assignment(name).ack_floor == 0 for name in names)
    env.group.set_leader(True)  # the client retries once there is a leader
    await env.store.save(STREAM, record("c0", floor=2))
    assert env.assignment("c0").ack_floor == 2


@run_async
async def test_a_skipped_update_fails_only_that_consumers_save() -> None:
    env = await setup("known")
    outcomes = await asyncio.gather(env.store.save(STREAM, record("known", floor=4)),
                                    env.store.save(STREAM, record("ghost", floor=4)),
                                    return_exceptions=True)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], RaftlogError)
    assert outcomes[1].reason == Reason.CONSUMER_NOT_FOUND
    assert "ghost" in outcomes[1].message
    assert len(env.group.state_updates()) == 1
    assert env.assignment("known").ack_floor == 4


@run_async
async def test_a_node_that_no_longer_leads_the_stream_saves_nothing() -> None:
    """A deposed primary may already know its successor's epoch (a replica told it): its
    acks must fail rather than pass the fence under that epoch, unseen by the successor."""
    leading: dict[str, int | None] = {STREAM: 1}
    env = await setup("c", epoch_of=leading.get)
    await env.store.save(STREAM, record("c", floor=2))
    assert env.group.state_updates()[-1].updates[0].fence_epoch == 1
    leading[STREAM] = None
    error = await raises(Reason.NOT_PRIMARY, env.store.save(STREAM, record("c", floor=5)))
    assert "no longer leads" in error.message
    assert env.assignment("c").ack_floor == 2


@run_async
async def test_oversize_batches_split_under_command_bytes_max() -> None:
    names = [f"c{i}" for i in range(6)]
    env = await setup(*names, "big")
    # Gaps keep every acked seq above the floor: ~16 KB per consumer, ~90 KB for "big" alone.
    wide = {name: range(2, 16_002, 2) for name in names} | {"big": range(2, 60_002, 2)}
    await asyncio.gather(*(env.store.save(STREAM, record(name, acked=seqs))
                           for name, seqs in wide.items()))
    commands = [cmd for cmd in env.group.commands
                if cmd.WhichOneof("command") == "consumer_state_update"]
    sizes = [cmd.ByteSize() for cmd in commands]
    command_bytes_max = limits.metadata_command_bytes_max
    assert all(size <= command_bytes_max for size in sizes), sizes
    assert len(commands) <= math.ceil(sum(sizes) / command_bytes_max) + 1, sizes
    big_parts = [p for cmd in commands for p in cmd.consumer_state_update.updates
                 if p.consumer == "big"]
    assert len(big_parts) >= 2  # one consumer's acks split over several commands
    for name, seqs in wide.items():
        assert env.assignment(name).acked == set(seqs)


def test_build_commands_honours_a_small_budget() -> None:
    saves = [consumer_raft.PendingSave(stream=STREAM, consumer=f"c{i}", ack_floor=0,
                                 acked=set(range(2, 2_000, 2)), delivered_seq=2_000)
             for i in range(3)]
    budget = 1_000
    batch = build_commands(saves, now_ms=1, budget_bytes=budget)
    assert len(batch) > 3
    assert all(sent.command.consumer_state_update.ByteSize() <= budget for sent in batch)
    merged: dict[str, set[int]] = {}
    for sent in batch:
        for part in sent.command.consumer_state_update.updates:
            merged.setdefault(part.consumer, set()).update(part.acked)
    assert merged == {save.consumer: save.acked for save in saves}


@run_async
async def test_a_save_sends_only_what_is_not_yet_committed() -> None:
    env = await setup("c")
    await env.store.save(STREAM, record(acked=(5,), delivered=5))
    await env.store.save(STREAM, record(acked=(5,), delivered=5))  # committed: no proposal
    await env.store.save(STREAM, record(acked=(5, 9), delivered=9))
    updates = env.group.state_updates()
    assert [list(u.updates[0].acked) for u in updates] == [[5], [9]]
    assert env.assignment().acked == {5, 9}


@run_async
async def test_pending_saves_are_bounded() -> None:
    env = await setup("a", "b", "c", pending_saves_max=2)
    env.group.gate = asyncio.Event()
    held = [asyncio.create_task(env.store.save(STREAM, record(name, floor=1)))
            for name in ("a", "b")]
    await asyncio.sleep(0)
    await raises(Reason.OVERLOADED, env.store.save(STREAM, record("c", floor=1)))
    env.group.gate.set()
    await asyncio.gather(*held)


@run_async
async def test_a_group_that_never_answers_fails_the_save_with_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "consumer_propose_grace_s", 0.01)
    env = await setup("c", propose_timeout_s=0.05)
    env.group.gate = asyncio.Event()  # never set
    error = await raises(Reason.TIMEOUT, env.store.save(STREAM, record(floor=1)))
    assert error.metadata["outcome"] == "unknown"


@run_async
async def test_close_fails_waiting_saves_and_later_ones() -> None:
    env = await setup("c")
    env.group.gate = asyncio.Event()
    task = asyncio.create_task(env.store.save(STREAM, record(floor=1)))
    await until(lambda: len(env.group.state_updates()) == 1)
    await env.store.close()
    await raises(Reason.SHUTTING_DOWN, task)
    await raises(Reason.SHUTTING_DOWN, env.store.save(STREAM, record(floor=2)))


# --------------------------------------------------------------------------- delete


@run_async
async def test_deleting_a_consumer_gone_from_raft_is_not_an_error() -> None:
    env = await setup()
    await env.store.delete(STREAM, "never-there")
    assert env.group.commands == []


@run_async
async def test_delete_commits_consumer_delete() -> None:
    env = await setup("c")
    await env.store.delete(STREAM, "c")
    assert [cmd.WhichOneof("command") for cmd in env.group.commands] == ["consumer_delete"]
    assert "c" not in env.group.state.consumers[STREAM]
    assert env.store.load(STREAM) == []


@run_async
async def test_a_save_pending_or_made_after_a_delete_never_brings_the_consumer_back() -> None:
    env = await setup("c", coalesce_ms=50)
    pending = asyncio.create_task(env.store.save(STREAM, record(floor=3)))
    await asyncio.sleep(0)
    await env.store.delete(STREAM, "c")
    await raises(Reason.CONSUMER_NOT_FOUND, pending)
    assert env.group.state_updates() == []  # dropped from the batch, never proposed
    await raises(Reason.CONSUMER_NOT_FOUND, env.store.save(STREAM, record(floor=4)))
    assert "c" not in env.group.state.consumers[STREAM]


# --------------------------------------------------------------------------- load


@pytest.mark.parametrize(("floor", "acked", "delivered", "cap", "expected"), [
    # (floor, acked, cursor, deliveries)
    (4, {7}, 10, 100, (4, [7], 10, [5, 6, 8, 9, 10])),
    (0, set(), 0, 100, (0, [], 0, [])),
    (2, {3, 4}, 4, 100, (4, [], 4, [])),  # floor not advanced over acked seqs: mended
    (0, {3}, 1, 100, (0, [3], 3, [1, 2])),  # cursor below an acked seq: raised to it
    (0, {2}, 10, 3, (0, [2], 10, [1, 3, 4])),  # capped: lowest unacked only, cursor kept
])
def test_load_turns_unacked_seqs_below_the_cursor_into_pending_deliveries(
        floor: int, acked: set[int], delivered: int, cap: int,
        expected: tuple[int, list[int], int, list[int]]) -> None:
    out = record_from_assignment(config=config("c"), created_ms=7, ack_floor=floor,
                                 acked=acked, delivered_seq=delivered, redeliveries_max=cap)
    assert (out.ack_floor, list(out.acked), out.delivered_seq, sorted(out.deliveries)) == expected
    assert set(out.deliveries.values()) <= {1}
    state = DeliveryState.from_record(out, now_s=0.0)  # passes the engine's record check
    assert state.ack_floor == out.ack_floor
    done = set(range(1, floor + 1)) | acked
    assert not done & {seq for seq, _ in state.pending.items()}
    assert state.delivered_seq >= max(done, default=0)  # no done seq is ever "new"


@run_async
async def test_load_returns_copies_of_the_committed_state() -> None:
    env = await setup("c")
    await env.store.save(STREAM, record(floor=2, acked=(4,), delivered=5))
    (loaded,) = env.store.load(STREAM)
    assert loaded.config == config("c")
    assert loaded.created_ms == env.assignment().created_ms
    loaded.config.description = "changed by the caller"
    assert env.assignment().config.description == ""


# --------------------------------------------------------------------------- failover


async def fetch(manager: ConsumerManager, name: str = "c") -> list[tuple[int, int]]:
    """(seq, deliver_count) of what one fetch hands out now."""
    return [(m.seq, m.deliver_count)
            for m in await manager.fetch(STREAM, name, batch=100, max_wait_ms=0)]


async def new_primary(env: Env, log: MemoryStreamLog) -> ConsumerManager:
    """Another node takes the stream over: its own store over the same group, caught up."""
    store = RaftConsumerStore(group=env.group, clock=env.clock)
    await store.catch_up()
    manager = ConsumerManager(store=store, clock=env.clock)
    manager.attach_stream(log, retention=LIMITS, subjects=("a", "b"))
    return manager


async def old_primary(env: Env, log: MemoryStreamLog, cfg: consumers_pb2.ConsumerConfig
                      ) -> ConsumerManager:
    manager = ConsumerManager(store=env.store, clock=env.clock)
    manager.attach_stream(log, retention=LIMITS, subjects=("a", "b"))
    ensure_ok(await env.group.propose(c.consumer_create(stream=STREAM, config=cfg),
                                      timeout_s=1))
    await manager.create(STREAM, cfg)
    return manager


@run_async
async def test_failover_never_redelivers_acked_seqs_and_redelivers_unacked_ones() -> None:
    env = await setup()
    log = MemoryStreamLog(name=STREAM)
    old = await old_primary(env, log, config("c"))
    for _ in range(10):
        log.append("a", b"x")
    assert await fetch(old) == [(seq, 1) for seq in range(1, 11)]
    await old.ack(STREAM, "c", [1, 2, 3, 4])
    await old.ack(STREAM, "c", [7])
    floors = [env.assignment().ack_floor]
    stale = old.info(STREAM, "c")
    old.detach_stream(STREAM)  # the old primary is gone

    new = await new_primary(env, log)
    assert new.info(STREAM, "c").state.ack_floor == stale.state.ack_floor == 4
    handed_out = await fetch(new)
    assert handed_out == []  # the unacked ones wait out their ack wait; nothing is new
    env.clock.advance(ACK_WAIT_S)
    redelivered = await fetch(new)
    assert redelivered == [(seq, 2) for seq in (5, 6, 8, 9, 10)]
    log.append("a", b"x")
    log.append("b", b"x")
    assert await fetch(new) == [(11, 1), (12, 1)]
    env.clock.advance(ACK_WAIT_S)
    again = await fetch(new)
    assert [seq for seq, _ in again] == [5, 6, 8, 9, 10, 11, 12]
    assert not {1, 2, 3, 4, 7} & {seq for seq, _ in handed_out + redelivered + again}

    await new.ack(STREAM, "c", [5, 6])
    floors.append(env.assignment().ack_floor)
    await new.ack(STREAM, "c", [8, 9, 10, 11, 12])
    floors.append(env.assignment().ack_floor)
    assert floors == [4, 7, 12]
    # A late save from the deposed primary moves nothing back.
    await env.store.save(STREAM, record(floor=4, acked=(7,), delivered=10))
    assert (env.assignment().ack_floor, env.assignment().acked) == (12, set())
    assert new.info(STREAM, "c").state.ack_floor == 12


@run_async
async def test_failover_hands_out_again_at_once_what_was_delivered_after_the_last_save(
) -> None:
    env = await setup()
    log = MemoryStreamLog(name=STREAM)
    old = await old_primary(env, log, config("c"))
    for _ in range(10):
        log.append("a", b"x")
    assert [seq for seq, _ in await fetch_some(old, 5)] == [1, 2, 3, 4, 5]
    await old.ack(STREAM, "c", [1, 2, 3, 4, 5])
    assert [seq for seq, _ in await fetch_some(old, 5)] == [6, 7, 8, 9, 10]  # never saved
    old.detach_stream(STREAM)

    new = await new_primary(env, log)
    assert await fetch(new) == [(seq, 1) for seq in range(6, 11)]


@run_async
async def test_failover_accepts_acks_of_what_the_old_primary_handed_out_and_never_undoes_them(
) -> None:
    env = await setup()
    log = MemoryStreamLog(name=STREAM)
    old = await old_primary(env, log, config("c"))
    for _ in range(10):
        log.append("a", b"x")
    assert [seq for seq, _ in await fetch_some(old, 8)] == list(range(1, 9))
    old.detach_stream(STREAM)  # kill -9: the deliveries were never saved

    new = await new_primary(env, log)
    settled = await new.ack(STREAM, "c", [*range(1, 9), 42])
    assert settled.applied == 8
    assert {seq: e.reason for seq, e in settled.refused.items()} == {42: Reason.NOT_DELIVERED}
    assert env.assignment().ack_floor == 8  # committed before the answer (G5)
    assert await fetch(new) == [(9, 1), (10, 1)]
    env.clock.advance(10 * ACK_WAIT_S)
    assert [seq for seq, _ in await fetch(new)] == [9, 10]
    newer = await new_primary(env, log)  # and after one more failover
    assert newer.info(STREAM, "c").state.ack_floor == 8


async def fetch_some(manager: ConsumerManager, batch: int) -> list[tuple[int, int]]:
    return [(m.seq, m.deliver_count)
            for m in await manager.fetch(STREAM, "c", batch=batch, max_wait_ms=0)]


@run_async
async def test_failover_of_a_filtered_consumer_redelivers_only_matching_seqs() -> None:
    env = await setup()
    log = MemoryStreamLog(name=STREAM)
    old = await old_primary(env, log, config("c", filter_subject="a"))
    for index in range(10):
        log.append("ab"[index % 2], b"x")  # "a" at the odd seqs
    assert [seq for seq, _ in await fetch(old)] == [1, 3, 5, 7, 9]
    await old.ack(STREAM, "c", [1, 5])
    old.detach_stream(STREAM)

    new = await new_primary(env, log)
    env.clock.advance(ACK_WAIT_S)
    assert [seq for seq, _ in await fetch(new)] == [3, 7, 9]
