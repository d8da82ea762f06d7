"""An operator's set of one consumer's progress on the stream's primary (node/ops/consumer_state.py,
the admin call `Cluster.SetConsumerState` that `raftlog audit repair` makes): committed through
the metadata group, bounded by the stream's commit seq, refused when the consumer moved, and
the primary serves the consumer from the new state afterwards; no save of the old state lands
after it.

In-process: a ClusterNode over the in-memory metadata group (MemoryRaftGroup) with a gate on
chosen kinds of command, a real StreamEngine on RocksDB in tmp_path, the consumer manager over
the Raft consumer store; no sockets, except for the one test of the call on the wire (the admin
Cluster service on a loopback port). Each test is named after the rule it checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.api.cluster import ClusterService, admin_metadata
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.existence import ExistenceCheck
from raftlog.node.config import NodeConfig
from raftlog.node.consumers.config import validate_config
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import RaftConsumerStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops.consumer_state import ConsumerStateOps
from raftlog.node.ops.route import LocalRoute
from raftlog.node.transport.calls import Call
from raftlog.node.transport.credentials import Credential, generate_secret
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.raft import commands as c
from raftlog.raft.api import OnApplied, ensure_ok
from raftlog.raft.memory import MemoryRaftGroup
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, consumers_pb2, streams_pb2, types_pb2

NODE = "n1"
STREAM = "orders"
CONSUMER = "c"
MESSAGES = 10
test_timeout_s = 10.0


class GatedGroup(MemoryRaftGroup):
    """The in-memory group; proposals of the kinds in `gates` wait until their event is set.
    Records the kind of every command it applied, in order."""

    def __init__(self, *, clock: FakeClock, on_applied: OnApplied) -> None:
        super().__init__(clock=clock, on_applied=on_applied)
        self.gates: dict[str, asyncio.Event] = {}
        self.applied: list[str] = []

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        kind = command.WhichOneof("command") or ""
        gate = self.gates.get(kind)
        if gate is not None:
            await gate.wait()
        result = await super().propose(command, timeout_s=timeout_s)
        self.applied.append(kind)
        return result


class Confirmed:
    """The existence check as the clustered operations use it (ops/raft_first.py)."""

    def __init__(self, check: ExistenceCheck) -> None:
        self._check = check

    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str, via: Call
                      ) -> RaftlogError:
        return await self._check.confirm(error, stream=stream, consumer=consumer, timeout_s=1)


@dataclass
class Env:
    group: GatedGroup
    cluster: ClusterNode
    manager: ConsumerManager
    ops: ConsumerStateOps

    def committed(self, name: str = CONSUMER) -> tuple[int, int, set[int]]:
        """(delivered seq, ack floor, acked) in the metadata."""
        entry = self.group.state.consumers[STREAM][name]
        return entry.delivered_seq, entry.ack_floor, set(entry.acked)

    def served(self) -> tuple[int, int]:
        """(delivered seq, ack floor) the primary serves."""
        state = self.manager.info(STREAM, CONSUMER).state
        return state.delivered_seq, state.ack_floor

    async def set(self, *, delivered: int, floor: int, acked: tuple[int, ...] = (),
                  expect: tuple[int, int, int] | None = None, stream: str = STREAM,
                  consumer: str = CONSUMER, via: Call | None = None
                  ) -> cluster_pb2.SetConsumerStateResponse:
        request = cluster_pb2.SetConsumerStateRequest(
            stream=stream, consumer=consumer, delivered_seq=delivered, ack_floor=floor,
            acked=acked)
        if expect is not None:
            request.expect.CopyFrom(consumers_pb2.ConsumerStateExpect(
                delivered_seq=expect[0], ack_floor=expect[1], acked_count=expect[2]))
        return await self.ops.set_state(request, via or Call())


@asynccontextmanager
async def primary_env(tmp_path: Path) -> AsyncIterator[Env]:
    """One member leading STREAM (seqs 1-10 committed) with consumer CONSUMER at delivered seq
    10, ack floor 8, committed."""
    clock = FakeClock()
    nodes: list[ClusterNode] = []
    group = GatedGroup(clock=clock, on_applied=lambda event: nodes[0].on_applied(event))
    storage = Storage(tmp_path / "data")
    committer = GroupCommitter(storage)
    committer.start(asyncio.get_running_loop())
    store = RaftConsumerStore(group=group, clock=clock, coalesce_ms=0)
    manager = ConsumerManager(store=store, clock=clock)
    engine = StreamEngine(store=RocksMessageStore(storage, committer), clock=clock,
                          consumers=manager, follow_raft=True)
    cluster = ClusterNode(config=NodeConfig(data_dir=tmp_path, node_id=NODE,
                                            raft_address="127.0.0.1:7000"),
                          group=group, engine=engine, consumers=manager, clock=clock,
                          consumer_store=store)
    nodes.append(cluster)
    ops = ConsumerStateOps(engine=engine, manager=manager, cluster=cluster,
                           metadata=Confirmed(ExistenceCheck(cluster)), where=LocalRoute())
    env = Env(group=group, cluster=cluster, manager=manager, ops=ops)
    try:
        for command in (
                c.member_join(node_id=NODE, raft_address="127.0.0.1:7000",
                              grpc_address="127.0.0.1:7001"),
                c.stream_create(config=types_pb2.StreamConfig(name=STREAM,
                                                              subjects=[f"{STREAM}.>"]),
                                replicas=[NODE], primary=NODE)):
            ensure_ok(await group.propose(command, timeout_s=1))
        await cluster.catch_up()
        await cluster.reconcile(STREAM)  # leads it
        await engine.publish(STREAM, [streams_pb2.PublishEntry(
            subject=f"{STREAM}.a", payload=b"%d" % k) for k in range(MESSAGES)])
        config = validate_config(consumers_pb2.ConsumerConfig(name=CONSUMER, ack_wait_ms=30_000),
                                 stream_subjects=[f"{STREAM}.>"])  # as the Raft-first create
        ensure_ok(await group.propose(c.consumer_create(stream=STREAM, config=config),
                                      timeout_s=1))
        await manager.create(STREAM, config)
        fetched = await manager.fetch(STREAM, CONSUMER, batch=MESSAGES, max_wait_ms=0)
        assert [m.seq for m in fetched] == list(range(1, MESSAGES + 1))
        await manager.ack(STREAM, CONSUMER, list(range(1, 9)))
        assert env.committed() == (10, 8, set())
        yield env
    finally:
        await store.close()
        await engine.stop()
        await committer.durable()
        committer.stop()
        storage.close()


def run(tmp_path: Path, body: Callable[[Env], Awaitable[None]]) -> None:
    async def main() -> None:
        async with primary_env(tmp_path) as env:
            await body(env)

    asyncio.run(asyncio.wait_for(main(), test_timeout_s))


def test_a_set_is_committed_and_the_primary_serves_the_consumer_from_it(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        reply = await env.set(delivered=5, floor=3, acked=(5,), expect=(10, 8, 0))
        assert (reply.changed, reply.commit_seq) == (True, MESSAGES) and reply.raft_index > 0
        assert env.committed() == (5, 3, {5})
        assert env.served() == (5, 3)
        # Delivery goes on from the new cursor (4 is pending again, due after its ack wait).
        fetched = await env.manager.fetch(STREAM, CONSUMER, batch=MESSAGES, max_wait_ms=0)
        assert [m.seq for m in fetched] == [6, 7, 8, 9, 10]
        again = await env.set(delivered=5, floor=3, acked=(5,))
        assert not again.changed

    run(tmp_path, body)


@pytest.mark.parametrize(("change", "reason"), [
    (dict(delivered=5, floor=3, expect=(10, 7, 0)), Reason.CONSUMER_CHANGED),
    (dict(delivered=11, floor=3), Reason.PAST_COMMITTED_END),
    (dict(delivered=9, floor=3, acked=(11,)), Reason.PAST_COMMITTED_END),
    (dict(delivered=1, floor=1, consumer="nobody"), Reason.CONSUMER_NOT_FOUND),
    (dict(delivered=1, floor=1, consumer="not.valid"), Reason.INVALID_NAME),
], ids=["consumer-moved", "delivered-past-the-end", "acked-past-the-end", "unknown-consumer",
        "bad-name"])
def test_a_refused_set_changes_nothing_and_the_consumer_is_served_as_before(
        tmp_path: Path, change: dict[str, object], reason: Reason) -> None:
    async def body(env: Env) -> None:
        with pytest.raises(RaftlogError) as caught:
            await env.set(**change)  # type: ignore[arg-type]
        assert caught.value.reason is reason, caught.value
        assert env.committed() == (10, 8, set())
        assert env.served() == (10, 8)

    run(tmp_path, body)


def test_only_the_serving_primary_sets_a_consumer(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        env.cluster.engine.get(STREAM).depose(RaftlogError(Reason.NOT_PRIMARY, "moving"))
        with pytest.raises(RaftlogError) as caught:
            await env.set(delivered=5, floor=3)
        assert caught.value.reason is Reason.NOT_PRIMARY
        assert env.committed() == (10, 8, set())

    run(tmp_path, body)


def test_the_consumer_is_out_of_service_while_the_set_commits(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        gate = env.group.gates["consumer_state_set"] = asyncio.Event()
        waiting = asyncio.create_task(
            env.manager.fetch(STREAM, CONSUMER, batch=1, max_wait_ms=5_000))
        await asyncio.sleep(0)
        setting = asyncio.create_task(env.set(delivered=5, floor=3, expect=(10, 8, 0)))
        with pytest.raises(RaftlogError) as woken:
            await waiting
        assert woken.value.reason is Reason.CATCHING_UP
        with pytest.raises(RaftlogError) as busy:
            env.manager.info(STREAM, CONSUMER)
        assert busy.value.reason is Reason.CATCHING_UP
        gate.set()
        assert (await setting).changed
        assert env.served() == (5, 3)

    run(tmp_path, body)


def test_a_save_in_flight_lands_before_the_set_never_after_it(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        saves = env.group.gates["consumer_state_update"] = asyncio.Event()
        acking = asyncio.create_task(env.manager.ack(STREAM, CONSUMER, [9]))
        await asyncio.sleep(0.05)  # the ack's save is proposed and waits at the gate
        setting = asyncio.create_task(env.set(delivered=5, floor=3))
        await asyncio.sleep(0.05)
        assert "consumer_state_set" not in env.group.applied  # it waits for the save
        saves.set()
        assert (await setting).changed
        with pytest.raises(RaftlogError) as told:  # durable, but the caller is told to retry
            await acking
        assert told.value.reason is Reason.CATCHING_UP
        applied = env.group.applied
        assert applied.index("consumer_state_update") < applied.index("consumer_state_set")
        assert env.committed() == (5, 3, set()) and env.served() == (5, 3)

    run(tmp_path, body)


def test_a_set_whose_caller_gave_up_while_it_waited_is_never_proposed(tmp_path: Path) -> None:
    """The set waits for a save in flight; its caller's deadline passes meanwhile (the caller
    may send it again). Proposed now, it would land after the ack that followed and undo it."""
    async def body(env: Env) -> None:
        saves = env.group.gates["consumer_state_update"] = asyncio.Event()
        acking = asyncio.create_task(env.manager.ack(STREAM, CONSUMER, [9]))
        await asyncio.sleep(0.05)  # the ack's save is proposed and waits at the gate
        setting = asyncio.create_task(env.set(
            delivered=5, floor=3, via=Call(deadline=time.monotonic() + 0.05)))
        await asyncio.sleep(0.2)  # past the set's deadline
        saves.set()
        with pytest.raises(RaftlogError) as late:
            await setting
        assert late.value.reason is Reason.TIMEOUT, late.value
        assert "consumer_state_set" not in env.group.applied
        with pytest.raises(RaftlogError) as told:  # durable, but the caller is told to retry
            await acking
        assert told.value.reason is Reason.CATCHING_UP
        # The ack stands, and the consumer is served again from the state it made.
        assert env.committed() == (10, 9, set()) and env.served() == (10, 9)

    run(tmp_path, body)


def test_a_set_committed_by_any_path_reaches_the_served_consumer(tmp_path: Path) -> None:
    """E.g. a proposer that gave up waiting (TIMEOUT) and served the old state again: the
    command applied later still replaces what the primary serves."""
    async def body(env: Env) -> None:
        ensure_ok(await env.group.propose(c.consumer_state_set(
            stream=STREAM, consumer=CONSUMER, ack_floor=2, acked=(), delivered_seq=2,
            commit_seq=MESSAGES), timeout_s=1))
        assert env.committed() == (2, 2, set()) and env.served() == (2, 2)
        fetched = await env.manager.fetch(STREAM, CONSUMER, batch=MESSAGES, max_wait_ms=0)
        assert [m.seq for m in fetched] == list(range(3, MESSAGES + 1))

    run(tmp_path, body)


class OnlyConsumerState:
    """The cluster operations the admin service is built with; this test uses one of them."""

    def __init__(self, ops: ConsumerStateOps) -> None:
        self.consumer_state = ops
        self.membership = self.views = self.audit = None


def test_the_call_needs_the_cluster_credential_and_refusals_carry_their_reason(
        tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        credential = Credential(generate_secret())
        server = grpc.aio.server()
        cluster_pb2_grpc.add_ClusterServicer_to_server(
            ClusterService(OnlyConsumerState(env.ops), credential), server)  # type: ignore[arg-type]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = cluster_pb2_grpc.ClusterStub(channel)
                signed = admin_metadata(credential, "SetConsumerState")
                past = cluster_pb2.SetConsumerStateRequest(stream=STREAM, consumer=CONSUMER,
                                                           delivered_seq=11, ack_floor=11)
                for metadata, code, reason in (
                        ((), grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED),
                        (signed, grpc.StatusCode.OUT_OF_RANGE, Reason.PAST_COMMITTED_END)):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.SetConsumerState(past, metadata=metadata, timeout=5)
                    assert caught.value.code() == code
                    refused = from_rpc_error(caught.value)
                    assert refused is not None and refused.reason is reason
                moved = cluster_pb2.SetConsumerStateRequest(
                    stream=STREAM, consumer=CONSUMER, delivered_seq=5, ack_floor=3,
                    expect=consumers_pb2.ConsumerStateExpect(delivered_seq=10, ack_floor=7))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.SetConsumerState(moved, metadata=signed, timeout=5)
                assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                refused = from_rpc_error(caught.value)
                assert refused is not None and refused.reason is Reason.CONSUMER_CHANGED
                moved.expect.ack_floor = 8
                reply = await stub.SetConsumerState(moved, metadata=signed, timeout=5)
                assert reply.changed and env.committed() == (5, 3, set())
        finally:
            await server.stop(grace=None)

    run(tmp_path, body)
