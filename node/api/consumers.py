"""The Consumers gRPC service: request validation and translation onto the ConsumerManager.

Owns nothing but the mapping: every rule about consumer state lives in `consumers.py`. Every
method is wrapped by `rpc.unary` / `rpc.server_stream`, so a RaftlogError reaches the client as
its status code with a google.rpc.ErrorInfo.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.manager import ConsumerManager, Settled
from raftlog.node.transport import rpc
from raftlog.v1 import consumers_pb2, consumers_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
STOPPED_DRAINED = "drained"
STOPPED_STREAM_DELETED = "stream deleted"
STOPPED_CONSUMER_DELETED = "consumer deleted"


def _names(stream: str, consumer: str | None = None) -> None:
    subjects.validate_name(stream, what="stream")
    if consumer is not None:
        subjects.validate_name(consumer, what="consumer")


def _at_most(field: str, value: int, *, high: int) -> int:
    if value > high:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{field} may be at most {high}, not {value}",
                           field=field, limit=high)
    return value


def _seqs(seqs: Sequence[int]) -> Sequence[int]:
    if not seqs:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "seqs is empty", field="seqs")
    _at_most("seqs", len(seqs), high=limits.ack_seqs_max)
    if 0 in seqs:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "seqs start at 1; 0 is not a seq",
                           field="seqs")
    return seqs


def _ack_response(seqs: Sequence[int], settled: Settled) -> consumers_pb2.AckResponse:
    """One result per requested seq, in request order; a refused seq carries its error."""
    refused = {seq: rpc.to_error_pb(error) for seq, error in settled.refused.items()}
    return consumers_pb2.AckResponse(applied=settled.applied, results=[
        consumers_pb2.AckResult(seq=seq, error=refused[seq]) if seq in refused
        else consumers_pb2.AckResult(seq=seq) for seq in seqs])


def _heartbeat_ms(value: int) -> int:
    heartbeat_ms = value or limits.subscribe_heartbeat_ms_default
    if heartbeat_ms < limits.subscribe_heartbeat_ms_min:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "heartbeat_ms must be at least "
                           f"{limits.subscribe_heartbeat_ms_min}", field="heartbeat_ms",
                           limit=limits.subscribe_heartbeat_ms_min)
    return _at_most("heartbeat_ms", heartbeat_ms, high=limits.fetch_wait_ms_max)


class ConsumersService(consumers_pb2_grpc.ConsumersServicer):
    def __init__(self, manager: ConsumerManager) -> None:
        self._manager = manager

    @rpc.unary
    async def CreateConsumer(self, request: consumers_pb2.CreateConsumerRequest,
                             context: Context) -> consumers_pb2.ConsumerInfo:
        _names(request.stream)
        return await self._manager.create(request.stream, request.config)

    @rpc.unary
    async def DeleteConsumer(self, request: consumers_pb2.DeleteConsumerRequest,
                             context: Context) -> consumers_pb2.DeleteConsumerResponse:
        _names(request.stream, request.consumer)
        await self._manager.delete(request.stream, request.consumer)
        return consumers_pb2.DeleteConsumerResponse()

    @rpc.unary
    async def ListConsumers(self, request: consumers_pb2.ListConsumersRequest,
                            context: Context) -> consumers_pb2.ListConsumersResponse:
        _names(request.stream)
        return consumers_pb2.ListConsumersResponse(consumers=self._manager.list(request.stream))

    @rpc.unary
    async def GetConsumerInfo(self, request: consumers_pb2.GetConsumerInfoRequest,
                              context: Context) -> consumers_pb2.ConsumerInfo:
        _names(request.stream, request.consumer)
        return self._manager.info(request.stream, request.consumer)

    @rpc.unary
    async def Fetch(self, request: consumers_pb2.FetchRequest,
                    context: Context) -> consumers_pb2.FetchResponse:
        _names(request.stream, request.consumer)
        batch = _at_most("batch", request.batch or 1, high=limits.fetch_batch_max)
        max_wait_ms = _at_most("max_wait_ms", request.max_wait_ms, high=limits.fetch_wait_ms_max)
        messages = await self._manager.fetch(request.stream, request.consumer, batch=batch,
                                             max_wait_ms=max_wait_ms)
        return consumers_pb2.FetchResponse(messages=messages)

    @rpc.unary
    async def Ack(self, request: consumers_pb2.AckRequest,
                  context: Context) -> consumers_pb2.AckResponse:
        _names(request.stream, request.consumer)
        seqs = _seqs(request.seqs)
        return _ack_response(seqs, await self._manager.ack(request.stream, request.consumer,
                                                           seqs))

    @rpc.unary
    async def Nak(self, request: consumers_pb2.NakRequest,
                  context: Context) -> consumers_pb2.AckResponse:
        _names(request.stream, request.consumer)
        delay_ms = _at_most("delay_ms", request.delay_ms, high=limits.nak_delay_ms_max)
        seqs = _seqs(request.seqs)
        return _ack_response(seqs, await self._manager.nak(request.stream, request.consumer,
                                                           seqs, delay_ms=delay_ms))

    @rpc.unary
    async def Term(self, request: consumers_pb2.TermRequest,
                   context: Context) -> consumers_pb2.AckResponse:
        _names(request.stream, request.consumer)
        seqs = _seqs(request.seqs)
        return _ack_response(seqs, await self._manager.term(request.stream, request.consumer,
                                                            seqs))

    @rpc.unary
    async def InProgress(self, request: consumers_pb2.InProgressRequest,
                         context: Context) -> consumers_pb2.AckResponse:
        _names(request.stream, request.consumer)
        seqs = _seqs(request.seqs)
        return _ack_response(seqs, await self._manager.in_progress(request.stream,
                                                                   request.consumer, seqs))

    @rpc.server_stream
    async def Subscribe(self, request: consumers_pb2.SubscribeRequest,
                        context: Context) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        _names(request.stream, request.consumer)
        batch = _at_most("batch", request.batch or limits.subscribe_batch_default,
                         high=limits.fetch_batch_max)
        heartbeat_ms = _heartbeat_ms(request.heartbeat_ms)
        self._manager.info(request.stream, request.consumer)  # NOT_FOUND before any event
        async for event in self._events(request, batch=batch, heartbeat_ms=heartbeat_ms):
            yield event

    async def _events(self, request: consumers_pb2.SubscribeRequest, *, batch: int,
                      heartbeat_ms: int) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        """Messages as they come, a heartbeat per idle `heartbeat_ms`, and a Stopped event
        when the consumer or its stream goes away (or, if asked, once it is drained).

        A `yield` returns once gRPC has handed the event to the transport, which waits for the
        client's flow-control window; so a client that does not read holds this loop, and what
        it costs the node is one fetch: at most limits.subscribe_buffer_bytes_max (or one
        message)."""
        stream, name = request.stream, request.consumer
        while True:
            try:
                if request.stop_when_empty and self._manager.is_drained(stream, name):
                    yield _stopped(STOPPED_DRAINED)
                    return
                messages = await self._manager.fetch(
                    stream, name, batch=batch, max_wait_ms=heartbeat_ms,
                    bytes_max=limits.subscribe_buffer_bytes_max)
                commit_seq = self._manager.commit_seq(stream)
            except RaftlogError as exc:
                confirmed = await self._confirm_gone(exc, stream=stream, consumer=name)
                reason = _gone_reason(confirmed)
                if reason is None:
                    raise confirmed from None
                yield _stopped(reason)
                return
            for message in messages:
                yield consumers_pb2.SubscribeEvent(message=message)
            if not messages:
                yield consumers_pb2.SubscribeEvent(
                    heartbeat=consumers_pb2.Heartbeat(commit_seq=commit_seq))

    async def _confirm_gone(self, exc: RaftlogError, *, stream: str, consumer: str
                            ) -> RaftlogError:
        """The error to act on when a subscription's stream or consumer seems gone: here, as
        it is (a clustered node confirms it first)."""
        return exc


def _stopped(reason: str) -> consumers_pb2.SubscribeEvent:
    return consumers_pb2.SubscribeEvent(stopped=consumers_pb2.Stopped(reason=reason))


def _gone_reason(exc: RaftlogError) -> str | None:
    if exc.reason == Reason.STREAM_NOT_FOUND:
        return STOPPED_STREAM_DELETED
    if exc.reason == Reason.CONSUMER_NOT_FOUND:
        return STOPPED_CONSUMER_DELETED
    return None
