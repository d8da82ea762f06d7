"""node/cluster/existence.py: a clustered node answers STREAM_NOT_FOUND / CONSUMER_NOT_FOUND only
once the metadata group confirms it; before that it answers CATCHING_UP and brings its copy in line.

In-process: a ClusterNode over the in-memory metadata group (MemoryRaftGroup), a real
StreamEngine on RocksDB in tmp_path, no sockets. Each test is named after the rule it checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.existence import ExistenceCheck
from raftlog.node.config import NodeConfig
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import RaftConsumerStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.streams import StreamEngine
from raftlog.raft import commands as c
from raftlog.raft.api import ensure_ok
from raftlog.raft.memory import MemoryRaftGroup
from raftlog.v1 import consumers_pb2, types_pb2

NODE = "n1"
STREAM = "orders"
test_timeout_s = 10.0


class Group(MemoryRaftGroup):
    """The in-memory group."""


@dataclass
class Env:
    group: Group
    cluster: ClusterNode
    check: ExistenceCheck

    async def propose(self, command: raft_pb2.RaftCommand) -> None:
        ensure_ok(await self.group.propose(command, timeout_s=1))

    async def create_stream(self) -> None:
        await self.propose(c.stream_create(config=types_pb2.StreamConfig(name=STREAM),
                                           replicas=[NODE], primary=NODE))

    async def create_consumer(self, name: str) -> None:
        await self.propose(c.consumer_create(
            stream=STREAM, config=consumers_pb2.ConsumerConfig(name=name, ack_wait_ms=30_000)))

    async def confirm(self, error: RaftlogError, consumer: str = "", *,
                      stream: str = STREAM) -> RaftlogError:
        return await self.check.confirm(error, stream=stream, consumer=consumer, timeout_s=1)


@asynccontextmanager
async def cluster_env(tmp_path: Path, *, caught_up: bool = True) -> AsyncIterator[Env]:
    clock = FakeClock()
    group = Group(clock=clock)
    storage = Storage(tmp_path / "data")
    committer = GroupCommitter(storage)
    committer.start(asyncio.get_running_loop())
    store = RaftConsumerStore(group=group, clock=clock)
    consumers = ConsumerManager(store=store, clock=clock)
    engine = StreamEngine(store=RocksMessageStore(storage, committer), clock=clock,
                          consumers=consumers, follow_raft=True)
    cluster = ClusterNode(config=NodeConfig(data_dir=tmp_path, node_id=NODE,
                                            raft_address="127.0.0.1:7000"),
                          group=group, engine=engine, consumers=consumers, clock=clock,
                          consumer_store=store)
    env = Env(group=group, cluster=cluster, check=ExistenceCheck(cluster))
    await env.propose(c.member_join(node_id=NODE, raft_address="127.0.0.1:7000",
                                    grpc_address="127.0.0.1:7001"))
    if caught_up:
        await cluster.catch_up()  # what ClusterNode.start does: a Barrier committed after start
    try:
        yield env
    finally:
        await store.close()
        await engine.stop()
        await committer.durable()
        committer.stop()
        storage.close()


def run(tmp_path: Path, body: Callable[[Env], Awaitable[None]], *,
        caught_up: bool = True) -> None:
    async def main() -> None:
        async with cluster_env(tmp_path, caught_up=caught_up) as env:
            await body(env)

    asyncio.run(asyncio.wait_for(main(), test_timeout_s))


def stream_not_found(stream: str = STREAM) -> RaftlogError:
    return RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {stream!r}", stream=stream)


def consumer_not_found(name: str) -> RaftlogError:
    return RaftlogError(Reason.CONSUMER_NOT_FOUND, f"no consumer {name!r}", stream=STREAM,
                        consumer=name)


@pytest.mark.parametrize("lag", ["not_caught_up", "no_leader"])
def test_a_node_that_lags_the_metadata_answers_catching_up_not_not_found(
        tmp_path: Path, lag: str) -> None:
    async def body(env: Env) -> None:
        if lag == "no_leader":
            env.group.set_leader(False)
        proposals = env.group.proposals
        answer = await env.confirm(consumer_not_found("c1"), consumer="c1")
        assert answer.reason is Reason.CATCHING_UP
        assert answer.status_name == "UNAVAILABLE" and "retry_after_ms" in answer.metadata
        assert env.group.proposals == proposals  # no barrier: it could not commit

    run(tmp_path, body, caught_up=lag != "not_caught_up")


def test_a_stream_the_metadata_has_is_created_here_and_the_answer_is_catching_up(
        tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.create_stream()
        await env.create_consumer("c1")
        assert STREAM not in env.cluster.engine.streams  # never reconciled here
        answer = await env.confirm(stream_not_found())
        assert answer.reason is Reason.CATCHING_UP
        assert env.cluster.engine.get(STREAM).name == STREAM
        assert env.cluster.consumers.info(STREAM, "c1").config.name == "c1"

    run(tmp_path, body)


def test_a_consumer_created_after_this_primary_took_over_is_adopted(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.create_stream()
        await env.cluster.reconcile(STREAM)  # leads it; consumers loaded (none yet)
        await env.create_consumer("late")  # e.g. through a primary deposed meanwhile
        with pytest.raises(RaftlogError) as caught:
            env.cluster.consumers.info(STREAM, "late")
        answer = await env.confirm(caught.value, consumer="late")
        assert answer.reason is Reason.CATCHING_UP
        assert env.cluster.consumers.info(STREAM, "late").config.name == "late"

    run(tmp_path, body)


def test_not_found_stands_once_a_barrier_confirms_it(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.create_stream()
        await env.cluster.reconcile(STREAM)
        cases = ((stream_not_found("absent"), "absent", ""),
                 (consumer_not_found("nope"), STREAM, "nope"))
        for error, stream, consumer in cases:
            proposals = env.group.proposals
            assert await env.confirm(error, consumer=consumer, stream=stream) is error
            assert env.group.proposals == proposals + 1  # the barrier

    run(tmp_path, body)


def test_other_errors_pass_through_untouched(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        error = RaftlogError(Reason.NOT_DELIVERED, "not delivered", seq=3)
        assert await env.confirm(error) is error

    run(tmp_path, body, caught_up=False)


def test_the_router_refuses_to_serve_locally_before_catching_up(tmp_path: Path) -> None:
    async def body(env: Env) -> None:
        await env.create_stream()
        with pytest.raises(RaftlogError) as caught:
            env.cluster.primary_address(STREAM)
        assert caught.value.reason is Reason.CATCHING_UP
        await env.cluster.catch_up()
        assert env.cluster.primary_address(STREAM) is None

    run(tmp_path, body, caught_up=False)
