"""chaos/sim: the seeded in-process simulation. A batch of schedules passes on the product as it
is; a seed replays the same run (same trace digest); a deliberately injected bug is found within
a bounded number of schedules, and its printed replay command fails the same way. Also the
rules of the pieces (virtual time, the disk, the network, the metadata model) the runs rely on.
No sockets, no disk, no processes: one virtual-time event loop per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.sim import __main__ as cli
from raftlog.chaos.sim.bugs import COMMIT_WITHOUT_MAJORITY
from raftlog.chaos.sim.checks import COMMIT_LAG, KNOWN_ISSUES, UNDELIVERED, Violation
from raftlog.chaos.sim.faults import make_schedule
from raftlog.chaos.sim.loop import SimDeadlock, SimLivelock, VirtualTimeLoop, owner_context
from raftlog.chaos.sim.network import LinkSettings, SimNetwork
from raftlog.chaos.sim.raft import SimRaft
from raftlog.chaos.sim.run import SimConfig, Verdict, run_schedule
from raftlog.chaos.sim.store import SimDisk, SimStore
from raftlog.chaos.sim.trace import Trace
from raftlog.raft import commands

batch_schedules = 50  # schedules of the clean batch (~0.15 s each)
bug_schedules_max = 40  # the injected bug must be found within this many schedules
NODES = ("n1", "n2", "n3")
T = TypeVar("T")


def run_on_virtual_time(body: Coroutine[Any, Any, T]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(body)
    finally:
        loop.close()


# ------------------------------------------------------------------------- whole runs


def test_a_batch_of_schedules_finds_no_violation() -> None:
    config = SimConfig()
    failed = [verdict for verdict in (run_schedule(seed, config)
                                      for seed in range(1, batch_schedules + 1))
              if not verdict.ok]
    assert not failed, "\n\n".join(verdict.report() for verdict in failed)


def test_five_nodes_run_clean_too() -> None:
    config = SimConfig(nodes=5, steps=12)
    failed = [v for v in (run_schedule(seed, config) for seed in (1, 2, 3)) if not v.ok]
    assert not failed, "\n\n".join(verdict.report() for verdict in failed)


def test_a_seed_replays_the_same_run() -> None:
    config = SimConfig(steps=12)
    first, again = run_schedule(7, config), run_schedule(7, config)
    assert first.digest == again.digest
    assert first.line().split("real=")[0] == again.line().split("real=")[0]
    assert run_schedule(8, config).digest != first.digest


def test_an_injected_bug_is_found_and_its_replay_fails_the_same_way() -> None:
    """The commit rule patched to count only the primary's own fsync: an isolated or
    crashed primary loses acknowledged publishes at the next failover."""
    config = SimConfig(bug=COMMIT_WITHOUT_MAJORITY)
    found: Verdict | None = None
    for seed in range(1, bug_schedules_max + 1):
        verdict = run_schedule(seed, config)
        if not verdict.ok:
            found = verdict
            break
    assert found is not None, f"not found in {bug_schedules_max} schedules"
    kinds = {v.kind for v in found.failures}
    assert kinds & {"acked-lost", "acked-moved", "ack-seq-changed", "read-not-committed"}
    replay = (f"python -m raftlog.chaos.sim --seed {found.seed} --schedules 1 --nodes 3 "
              f"--steps {config.steps} --bug {COMMIT_WITHOUT_MAJORITY}")
    assert replay in found.report()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli.main(replay.split()[3:])
    assert status == 1
    output = printed.getvalue()
    assert f"FAIL seed={found.seed} digest={found.digest}" in output
    assert f"replay: {replay}" in output


def test_the_cli_prints_verdicts_and_the_throughput() -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli.main(["--seed", "3", "--schedules", "2", "--steps", "5"])
    lines = printed.getvalue().splitlines()
    assert status == 0
    assert [line.split()[:2] for line in lines[:2]] == [["ok", "seed=3"], ["ok", "seed=4"]]
    assert lines[-1].startswith("2 schedules, 0 failed") and "schedules/minute" in lines[-1]


def test_a_known_product_issue_fails_a_run_only_when_strict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KNOWN_ISSUES, COMMIT_LAG, "reported, not fixed yet")
    lag = Violation(COMMIT_LAG, "s1: n2 commit seq stays at 4")
    lost = Violation("acked-lost", "s1: p0-1")
    assert Verdict(seed=1, config=SimConfig(), violations=[lag], digest="").ok
    strict = Verdict(seed=1, config=SimConfig(strict=True), violations=[lag], digest="")
    assert not strict.ok and strict.config.replay_command(1).endswith(" --strict")
    assert not Verdict(seed=1, config=SimConfig(), violations=[lag, lost], digest="").ok


FIXED_ISSUE_SEEDS = [
    # (seed, the violation it found before the fix)
    (26, COMMIT_LAG),  # a heartbeat's commit notice applied before its group's fsync, capped
    (284, UNDELIVERED),  # pending deliveries above a new primary's commit seq forgotten
]


@pytest.mark.parametrize(("seed", "kind"), FIXED_ISSUE_SEEDS,
                         ids=[kind for _, kind in FIXED_ISSUE_SEEDS])
def test_the_seeds_that_found_fixed_product_issues_now_pass_strict(seed: int,
                                                                   kind: str) -> None:
    assert kind not in KNOWN_ISSUES
    verdict = run_schedule(seed, SimConfig(strict=True))
    assert verdict.ok, verdict.report()


def test_a_schedule_is_a_function_of_its_seed() -> None:
    def schedule(seed: int) -> list[str]:
        return [f.describe() for f in make_schedule(random.Random(seed), nodes=NODES,
                                                     steps=30)]

    assert schedule(1) == schedule(1) != schedule(2)
    assert not any("power-loss" in line for line in schedule(1))


# ------------------------------------------------------------------------- virtual time


def test_virtual_time_jumps_to_the_next_timer() -> None:
    async def body() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        return loop.time()

    started = time.perf_counter()
    assert run_on_virtual_time(body()) == 3600
    assert time.perf_counter() - started < 1.0


def test_a_run_where_nothing_can_happen_is_a_deadlock() -> None:
    async def body() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimDeadlock):
        run_on_virtual_time(body())


def test_a_busy_loop_that_never_lets_time_pass_is_a_livelock() -> None:
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    loop = VirtualTimeLoop(spins_max=1_000)
    task = loop.create_task(spin())
    try:
        with pytest.raises(SimLivelock):
            loop.run_until_complete(task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, SimLivelock):
            loop.run_until_complete(task)
        loop.close()


def test_a_crash_cancels_exactly_the_tasks_of_its_incarnation() -> None:
    async def body() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)

        async def forever() -> None:
            await asyncio.sleep(1e9)

        mine = loop.create_task(forever(), context=owner_context("n1#1"))
        other = loop.create_task(forever(), context=owner_context("n2#1"))
        await asyncio.sleep(0)
        assert await loop.owners.cancel_owned("n1#1") == 0
        result = mine.cancelled(), other.done()
        other.cancel()
        return result

    assert run_on_virtual_time(body()) == (True, False)


# ------------------------------------------------------------------------- the disk


def test_the_disk_holds_a_write_once_a_durable_covers_it_and_a_kill_loses_nothing() -> None:
    async def body() -> tuple[int, int, int]:
        disk = SimDisk()
        store = SimStore(disk, fsync_s=lambda: 0.001)
        batch = store.batch()
        batch.put_next_stream_id(5)
        store.write(batch)
        before = disk.image.next_stream_id()
        await store.durable()
        after = disk.image.next_stream_id()
        batch = store.batch()
        batch.put_next_stream_id(9)
        store.write(batch)
        lost = store.crash(random.Random(1), power_loss=False)
        return before, after, lost * 100 + disk.image.next_stream_id()

    assert run_on_virtual_time(body()) == (1, 5, 9)


def test_a_power_loss_keeps_a_prefix_of_the_unsynced_batches() -> None:
    disk = SimDisk()
    store = SimStore(disk, fsync_s=lambda: 0.001)
    for stream_id in range(2, 12):
        batch = store.batch()
        batch.put_next_stream_id(stream_id)
        store.write(batch)
    lost = store.crash(random.Random(3), power_loss=True)
    kept = disk.image.next_stream_id()
    assert lost == 11 - kept  # batches 2..kept reached the disk, in order
    later = store.batch()
    later.put_next_stream_id(99)
    store.write(later)  # a dead incarnation writes nowhere
    assert SimStore(disk, fsync_s=lambda: 0.001).next_stream_id() == kept


# ------------------------------------------------------------------------- network, metadata


def _network(loop: asyncio.AbstractEventLoop) -> SimNetwork:
    network = SimNetwork(rng=random.Random(1), trace=Trace(loop.time),
                         base=LinkSettings(latency_s=0.001, jitter_s=0.0))
    for node in NODES:
        network.attach(node, context=owner_context(f"{node}#1"), endpoint=None)
    return network


def test_a_blocked_direction_holds_a_call_until_it_heals() -> None:
    async def body() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        network = _network(loop)
        network.block({("n1", "n2")})
        loop.call_later(0.5, network.heal)

        async def answer() -> str:
            return "pong"

        reply = await network.unary("n1", "n2", answer, timeout_s=2.0, what="test")
        return reply, loop.time()

    reply, at_s = run_on_virtual_time(body())
    assert reply == "pong" and 0.5 < at_s < 0.51


def test_a_node_cut_off_from_the_raft_leader_cannot_commit() -> None:
    async def body() -> tuple[Reason, int]:
        loop = asyncio.get_running_loop()
        network = _network(loop)
        raft = SimRaft(nodes=NODES, network=network, rng=random.Random(1),
                       trace=Trace(loop.time))
        clock = _Clock(loop)
        views = {node: raft.view(node, clock=clock) for node in NODES}
        ticking = loop.create_task(raft.run())
        await asyncio.sleep(1.0)  # an election
        leader = raft.leader
        assert leader is not None
        follower = next(node for node in NODES if node != leader)
        network.block({(follower, leader), (leader, follower)})
        with pytest.raises(RaftlogError) as refused:
            await views[follower].propose(commands.barrier(), timeout_s=1.0)
        await views[leader].propose(commands.barrier(), timeout_s=1.0)
        ticking.cancel()
        return refused.value.reason, views[leader].applied_index

    assert run_on_virtual_time(body()) == (Reason.NO_LEADER, 1)


class _Clock:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def wall_ms(self) -> int:
        return int(self._loop.time() * 1000)

    def monotonic_s(self) -> float:
        return self._loop.time()
