"""Streaming calls to a node that dies mid-call (kill -9): each ends promptly with the right
error and leaves nothing running behind, on both sides.

The node "dies" when the TCP proxy in front of its in-process gRPC server drops every connection
and its listener, as the kernel does for a killed process: the other side sees the connection
close and nothing answers any more.

- A replication link (PeerClient.replicate, as PeerLink uses it) that reopens its call to a
  dead replica: every request generator it handed to a broken call is closed, and no drainer
  task piles up (grpc.aio's own drainer waited on them forever; the garbage collector then
  logged "Task was destroyed but it is pending" and "aclose(): asynchronous generator is
  already running" on the node, issue seen in test_objects' kill of a primary).
- The forwarder's client stream (a split PublishStream's part for another primary) and server
  stream (a relayed Subscribe): FORWARD_FAILED within `ended_s_max`, and no task left; a
  caller that gives up cancels the call on the serving node.
- A relayed server stream from a node that went silent with its connections open (cut off,
  frozen; no deadline on a Subscribe): ends once liveness finds the node silent (it waited
  for ever before).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.ops import canonical
from raftlog.node.replication.links import GrpcLinkTransport, LinkCall, LinkReset
from raftlog.node.replication.primary import PeerLink
from raftlog.node.transport.calls import Call
from raftlog.node.transport.channels import ChannelPool
from raftlog.node.transport.credentials import Credential, generate_secret
from raftlog.node.transport.forwarding import Forwarder
from raftlog.node.transport.peer import PeerClient
from raftlog.v1 import consumers_pb2, consumers_pb2_grpc, streams_pb2, streams_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
test_timeout_s = 20.0
ended_s_max = 3.0  # a call to a node that died ends this soon (its connection closed)


def run(case: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(case(), test_timeout_s))


async def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


def others_pending() -> list[asyncio.Task[Any]]:
    """The client side's tasks still pending (grpc.aio's calls and raftlog's), not the one
    running this test; the in-process servers' tasks (compiled grpc code) and the proxy's do
    not count."""
    current = asyncio.current_task()
    return [task for task in asyncio.all_tasks()
            if task is not current and not task.done() and _client_side(task)]


def _client_side(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    filename = code.co_filename if code is not None else ""
    return "/grpc/aio/" in filename or "/node/" in filename


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of `target`; `kill()` is the serving node's kill -9."""

    def __init__(self, target: str) -> None:
        self._target_host, port = target.rsplit(":", 1)
        self._target_port = int(port)
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._target_host,
                                                             self._target_port)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.close()

    def freeze(self) -> None:
        """The node goes silent with its connections open (cut off, or stopped)."""
        self._flowing.clear()

    async def kill(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        for pipe in self._pipes:
            pipe.cancel()  # a frozen pipe waits for nothing else
        await asyncio.gather(*self._pipes, return_exceptions=True)


@asynccontextmanager
async def behind_proxy(add: Callable[[grpc.aio.Server], None]) -> AsyncIterator[Proxy]:
    server = grpc.aio.server()
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    proxy = Proxy(f"127.0.0.1:{port}")
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.kill()
        await server.stop(grace=None)


# ------------------------------------------------------------------ replication links


class Replica(replication_pb2_grpc.ReplicationServicer):
    """Acknowledges each request of a Replicate call."""

    async def Replicate(self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest],
                        context: Context) -> AsyncIterator[replication_pb2.ReplicateAck]:
        async for request in request_iterator:
            yield replication_pb2.ReplicateAck(request_id=request.request_id)


class Recording:
    """GrpcLinkTransport that keeps every request iterator it was handed."""

    def __init__(self, transport: GrpcLinkTransport) -> None:
        self._transport = transport
        self.handed: list[AsyncIterator[replication_pb2.ReplicateRequest]] = []

    def open(self, node_id: str,
             requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> LinkCall:
        self.handed.append(requests)
        return self._transport.open(node_id, requests)


def closed(requests: Any) -> bool:
    return bool(requests.ag_frame is None)  # an async generator that finished or was closed


def test_a_link_to_a_dead_replica_leaves_no_request_generator_open() -> None:
    run(_a_link_to_a_dead_replica_leaves_no_request_generator_open)


async def _a_link_to_a_dead_replica_leaves_no_request_generator_open() -> None:
    async with behind_proxy(
            lambda server: replication_pb2_grpc.add_ReplicationServicer_to_server(
                Replica(), server)) as proxy:
        peers = PeerClient(node_id="n1", credential=Credential(generate_secret()),
                           address_of=lambda _: proxy.address)
        transport = Recording(GrpcLinkTransport(peers))
        link = PeerLink(node_id="n2", self_id="n1", transport=transport, clock=FakeClock(),
                        on_ack=lambda *_: None, on_reset=lambda _: None)
        link.start()
        try:
            await wait_for(lambda: bool(transport.handed), timeout_s=5, what="a call opened")
            link.tick()  # the probe whose answer connects the link
            await wait_for(lambda: link.connected, timeout_s=5, what="the link connected")
            await proxy.kill()
            await wait_for(lambda: len(transport.handed) >= 5, timeout_s=10,
                           what="the link reopened its call to the dead replica 4 times")
            broken = transport.handed[:-1]
            await wait_for(lambda: all(map(closed, broken)), timeout_s=ended_s_max,
                           what="the request generators of the broken calls closed")
            # Left: the link itself, and at most its current call's setup task (grpc.aio's)
            # and drainer; not one drainer per broken call.
            assert len(others_pending()) <= 3, others_pending()
        finally:
            await link.stop()
            await peers.close()


def test_the_requests_of_a_replicate_call_close_when_the_replica_dies(
        caplog: pytest.LogCaptureFixture) -> None:
    run(_the_requests_of_a_replicate_call_close_when_the_replica_dies)
    gc.collect()  # what a broken call left behind is reported when it is collected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def _the_requests_of_a_replicate_call_close_when_the_replica_dies() -> None:
    queue: asyncio.Queue[replication_pb2.ReplicateRequest] = asyncio.Queue()

    async def requests() -> AsyncIterator[replication_pb2.ReplicateRequest]:
        while True:
            yield await queue.get()

    async with behind_proxy(
            lambda server: replication_pb2_grpc.add_ReplicationServicer_to_server(
                Replica(), server)) as proxy:
        peers = PeerClient(node_id="n1", credential=Credential(generate_secret()),
                           address_of=lambda _: proxy.address)
        handed = requests()
        call = GrpcLinkTransport(peers).open("n2", handed)
        acks = call.acks()
        queue.put_nowait(replication_pb2.ReplicateRequest(request_id=1))
        assert (await anext(acks)).request_id == 1
        await proxy.kill()
        started = time.monotonic()
        with pytest.raises(LinkReset):
            await anext(acks)
        assert time.monotonic() - started < ended_s_max
        await wait_for(lambda: closed(handed), timeout_s=ended_s_max,
                       what="the requests closed with the call")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
        await peers.close()


# ------------------------------------------------------------------ forwarded streams


class Primary(streams_pb2_grpc.StreamsServicer, consumers_pb2_grpc.ConsumersServicer):
    """A PublishStream that reads slowly and a Subscribe that sends a heartbeat every 10 ms;
    `ended` notes how each call ended on this side."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.read = 0

    async def PublishStream(self, request_iterator: AsyncIterator[streams_pb2.PublishRequest],
                            context: Context) -> streams_pb2.PublishBatchResponse:
        try:
            async for _ in request_iterator:
                self.read += 1
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        self.ended.append("answered")
        return streams_pb2.PublishBatchResponse(acked=self.read)

    async def Subscribe(self, request: consumers_pb2.SubscribeRequest, context: Context
                        ) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        try:
            for seq in range(1, 100_000):
                yield consumers_pb2.SubscribeEvent(
                    heartbeat=consumers_pb2.Heartbeat(commit_seq=seq))
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise


class Answering:
    """The liveness a Forwarder asks; `silent` once the test says the node went silent."""

    def __init__(self) -> None:
        self.silent = False

    def unreachable(self, address: str) -> RaftlogError | None:
        if not self.silent:
            return None
        return RaftlogError(Reason.FORWARD_FAILED, f"{address} stopped answering",
                            address=address)


def serve_primary(primary: Primary) -> Callable[[grpc.aio.Server], None]:
    def add(server: grpc.aio.Server) -> None:
        streams_pb2_grpc.add_StreamsServicer_to_server(primary, server)
        consumers_pb2_grpc.add_ConsumersServicer_to_server(primary, server)
    return add


def messages(count: int) -> list[streams_pb2.PublishRequest]:
    # Larger than the stream's flow-control window in all: the last writes wait for the reader.
    return [streams_pb2.PublishRequest(stream="s", subject="a", payload=b"x" * 100_000)
            for _ in range(count)]


def test_a_forwarded_client_stream_fails_fast_and_leaves_nothing_when_the_primary_dies() -> None:
    run(_a_forwarded_client_stream_fails_fast_and_leaves_nothing_when_the_primary_dies)


async def _a_forwarded_client_stream_fails_fast_and_leaves_nothing_when_the_primary_dies(
        ) -> None:
    primary = Primary()
    pool = ChannelPool()
    async with behind_proxy(serve_primary(primary)) as proxy:
        forwarder = Forwarder(pool, Answering())
        forwarded = asyncio.create_task(forwarder.client_stream(
            proxy.address, canonical.PUBLISH_STREAM, messages(40),
            Call(deadline=time.monotonic() + 15)))
        await wait_for(lambda: primary.read >= 2, timeout_s=5, what="the primary reads")
        await proxy.kill()
        started = time.monotonic()
        with pytest.raises(RaftlogError) as caught:
            await forwarded
        assert time.monotonic() - started < ended_s_max
        assert caught.value.reason is Reason.FORWARD_FAILED
        await wait_for(lambda: primary.ended == ["cancelled"], timeout_s=ended_s_max,
                       what="the call ended on the primary's side")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
    await pool.close()


def test_a_client_stream_given_up_by_its_caller_is_cancelled_on_the_primary() -> None:
    run(_a_client_stream_given_up_by_its_caller_is_cancelled_on_the_primary)


async def _a_client_stream_given_up_by_its_caller_is_cancelled_on_the_primary() -> None:
    primary = Primary()
    pool = ChannelPool()
    async with behind_proxy(serve_primary(primary)) as proxy:
        forwarder = Forwarder(pool, Answering())
        forwarded = asyncio.create_task(forwarder.client_stream(
            proxy.address, canonical.PUBLISH_STREAM, messages(40),
            Call(deadline=time.monotonic() + 15)))
        await wait_for(lambda: primary.read >= 2, timeout_s=5, what="the primary reads")
        forwarded.cancel()
        await asyncio.gather(forwarded, return_exceptions=True)
        await wait_for(lambda: primary.ended == ["cancelled"], timeout_s=ended_s_max,
                       what="the cancellation reached the primary")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
    await pool.close()


def test_a_relayed_server_stream_fails_fast_and_leaves_nothing_when_the_primary_dies() -> None:
    run(_a_relayed_server_stream_fails_fast_and_leaves_nothing_when_the_primary_dies)


async def _a_relayed_server_stream_fails_fast_and_leaves_nothing_when_the_primary_dies(
        ) -> None:
    primary = Primary()
    pool = ChannelPool()
    async with behind_proxy(serve_primary(primary)) as proxy:
        forwarder = Forwarder(pool, Answering())
        relay = forwarder.server_stream(proxy.address, canonical.SUBSCRIBE,
                                        consumers_pb2.SubscribeRequest(stream="s", consumer="c"),
                                        Call())  # a Subscribe without a deadline
        assert (await anext(relay)).heartbeat.commit_seq == 1
        await proxy.kill()
        started = time.monotonic()
        with pytest.raises(RaftlogError) as caught:
            while True:  # what was already on its way may still come
                await anext(relay)
        assert time.monotonic() - started < ended_s_max
        assert caught.value.reason is Reason.FORWARD_FAILED
        await wait_for(lambda: primary.ended == ["cancelled"], timeout_s=ended_s_max,
                       what="the stream ended on the primary's side")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
    await pool.close()


def test_a_relayed_server_stream_closed_by_its_reader_is_cancelled_on_the_primary() -> None:
    run(_a_relayed_server_stream_closed_by_its_reader_is_cancelled_on_the_primary)


async def _a_relayed_server_stream_closed_by_its_reader_is_cancelled_on_the_primary() -> None:
    primary = Primary()
    pool = ChannelPool()
    async with behind_proxy(serve_primary(primary)) as proxy:
        forwarder = Forwarder(pool, Answering())
        relay = forwarder.server_stream(proxy.address, canonical.SUBSCRIBE,
                                        consumers_pb2.SubscribeRequest(stream="s", consumer="c"),
                                        Call())
        assert (await anext(relay)).heartbeat.commit_seq == 1
        await relay.aclose()  # the front's client went away
        await wait_for(lambda: primary.ended == ["cancelled"], timeout_s=ended_s_max,
                       what="the cancellation reached the primary")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
    await pool.close()


def test_a_relayed_server_stream_from_a_primary_gone_silent_ends_when_liveness_says_so() -> None:
    run(_a_relayed_server_stream_from_a_primary_gone_silent_ends_when_liveness_says_so)


async def _a_relayed_server_stream_from_a_primary_gone_silent_ends_when_liveness_says_so(
        ) -> None:
    primary = Primary()
    pool = ChannelPool()
    liveness = Answering()
    async with behind_proxy(serve_primary(primary)) as proxy:
        forwarder = Forwarder(pool, liveness)
        relay = forwarder.server_stream(proxy.address, canonical.SUBSCRIBE,
                                        consumers_pb2.SubscribeRequest(stream="s", consumer="c"),
                                        Call())  # no deadline: only liveness can end it
        assert (await anext(relay)).heartbeat.commit_seq == 1
        proxy.freeze()
        await asyncio.sleep(0.2)  # what was on its way has come; nothing more will
        liveness.silent = True
        started = time.monotonic()
        with pytest.raises(RaftlogError) as caught:
            while True:
                await asyncio.wait_for(anext(relay), ended_s_max)
        assert time.monotonic() - started < ended_s_max
        assert caught.value.message.endswith("stopped answering")
        await wait_for(lambda: not others_pending(), timeout_s=ended_s_max,
                       what="no task left")
    await pool.close()
