"""transport/forwarding.py and calls.py: the one forwarder, against in-process gRPC servers.

A forwarded call's answer comes back parsed; its failure comes back as the RaftlogError the
serving node raised (reason and metadata intact), as FORWARD_FAILED when the node cannot be
reached or goes silent, and with its own status code when it carries no raftlog ErrorInfo; a
call that went round too often is refused before it is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import canonical
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import HOPS_HEADER, Call
from raftlog.node.transport.channels import ChannelPool
from raftlog.node.transport.forwarding import Forwarder
from raftlog.v1 import streams_pb2, streams_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
test_timeout_s = 20.0


class Answers(streams_pb2_grpc.StreamsServicer):
    """Publish answers by the message's subject: "ok", "missing", "slow", "bare"."""

    def __init__(self) -> None:
        self.hops: list[str] = []

    @rpc.unary
    async def Publish(self, request: streams_pb2.PublishRequest,
                      context: Context) -> streams_pb2.PublishAck:
        self.hops.extend(v for k, v in context.invocation_metadata() or () if k == HOPS_HEADER)
        if request.subject == "missing":
            raise RaftlogError(Reason.STREAM_NOT_FOUND, "no stream named 's'", stream="s")
        if request.subject == "slow":
            await asyncio.sleep(30)
        if request.subject == "bare":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too big")
        return streams_pb2.PublishAck(stream=request.stream, seq=7)


class Silent:
    def __init__(self) -> None:
        self.gone: RaftlogError | None = None

    def unreachable(self, address: str) -> RaftlogError | None:
        return self.gone


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[str, Answers]]:
    server = grpc.aio.server()
    answers = Answers()
    streams_pb2_grpc.add_StreamsServicer_to_server(answers, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", answers
    finally:
        await server.stop(grace=None)


def run(case: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(case(), test_timeout_s))


def publish(subject: str) -> streams_pb2.PublishRequest:
    return streams_pb2.PublishRequest(stream="s", subject=subject, payload=b"x")


async def forward(subject: str, *, via: Call | None = None, liveness: Silent | None = None
                  ) -> tuple[streams_pb2.PublishAck, Answers]:
    pool = ChannelPool()
    try:
        async with serving() as (address, answers):
            forwarder = Forwarder(pool, liveness or Silent())
            ack = await forwarder.unary(address, canonical.PUBLISH, publish(subject),
                                        via or Call(deadline=time.monotonic() + 5))
            return ack, answers
    finally:
        await pool.close()


def test_an_answer_comes_back_parsed_with_the_hop_count_raised() -> None:
    run(_an_answer_comes_back_parsed_with_the_hop_count_raised)


async def _an_answer_comes_back_parsed_with_the_hop_count_raised() -> None:
    ack, answers = await forward("ok", via=Call(hops=1, deadline=time.monotonic() + 5))
    assert (ack.stream, ack.seq) == ("s", 7)
    assert answers.hops == ["2"]


def test_the_serving_nodes_error_comes_back_as_it_raised_it() -> None:
    run(_the_serving_nodes_error_comes_back_as_it_raised_it)


async def _the_serving_nodes_error_comes_back_as_it_raised_it() -> None:
    with pytest.raises(RaftlogError) as caught:
        await forward("missing")
    assert caught.value.reason is Reason.STREAM_NOT_FOUND
    assert caught.value.metadata == {"stream": "s"}
    assert rpc.grpc_status(caught.value.reason) is grpc.StatusCode.NOT_FOUND


def test_a_status_without_error_info_keeps_its_code() -> None:
    run(_a_status_without_error_info_keeps_its_code)


async def _a_status_without_error_info_keeps_its_code() -> None:
    with pytest.raises(RaftlogError) as caught:
        await forward("bare")
    assert caught.value.reason is Reason.FORWARD_FAILED
    assert caught.value.status_name == "RESOURCE_EXHAUSTED"
    assert rpc.to_status(caught.value).code is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_node_that_goes_silent_fails_the_call_before_its_deadline() -> None:
    run(_a_node_that_goes_silent_fails_the_call_before_its_deadline)


async def _a_node_that_goes_silent_fails_the_call_before_its_deadline() -> None:
    liveness = Silent()
    asyncio.get_running_loop().call_later(0.3, setattr, liveness, "gone", RaftlogError(
        Reason.NOT_PRIMARY, "the primary went silent"))
    started = time.monotonic()
    with pytest.raises(RaftlogError) as caught:
        await forward("slow", liveness=liveness)
    assert caught.value.reason is Reason.NOT_PRIMARY
    assert time.monotonic() - started < 3


def test_an_unreachable_node_is_forward_failed() -> None:
    run(_an_unreachable_node_is_forward_failed)


async def _an_unreachable_node_is_forward_failed() -> None:
    pool = ChannelPool()
    try:
        with pytest.raises(RaftlogError) as caught:
            await Forwarder(pool, Silent()).unary(
                "127.0.0.1:1", canonical.PUBLISH, publish("ok"),
                Call(deadline=time.monotonic() + 2))
    finally:
        await pool.close()
    assert caught.value.reason is Reason.FORWARD_FAILED
    assert caught.value.metadata["address"] == "127.0.0.1:1"


def test_a_call_that_went_round_too_often_is_refused_before_it_is_sent() -> None:
    run(_a_call_that_went_round_too_often_is_refused_before_it_is_sent)


async def _a_call_that_went_round_too_often_is_refused_before_it_is_sent() -> None:
    with pytest.raises(RaftlogError) as caught:
        await forward("ok", via=Call(hops=limits.forward_hops_max))
    assert caught.value.reason is Reason.HOP_LIMIT


def test_a_call_without_deadline_gets_the_default_timeout() -> None:
    assert Call().remaining_s() is None
    assert Call().timeout_s() == limits.forward_timeout_s_default
    assert 0 < Call(deadline=time.monotonic() + 2).timeout_s() <= 2
