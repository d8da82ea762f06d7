"""Consumer operations, whatever protocol asked: check the request, then serve it on the
stream's primary (here, or forwarded there). Every rule about consumer state lives in
node/consumers; a failure that denies existence is confirmed by the metadata rules first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.manager import ConsumerManager, Settled
from raftlog.node.ops import canonical, route
from raftlog.node.ops.metadata import ConsumerMetadata
from raftlog.node.ops.route import Route
from raftlog.node.ops.subscribe import Subscription, at_most
from raftlog.node.transport import auth, rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.forwarding import Forward
from raftlog.node.transport.subscriptions import StreamSubscriptions
from raftlog.v1 import consumers_pb2

Resp = TypeVar("Resp")


def _names(stream: str, consumer: str | None = None) -> None:
    subjects.validate_name(stream, what="stream")
    if consumer is not None:
        subjects.validate_name(consumer, what="consumer")


def _seqs(seqs: Sequence[int], *, field: str = "seqs") -> Sequence[int]:
    if not seqs:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{field} is empty", field=field)
    at_most(field, len(seqs), high=limits.ack_seqs_max)
    if 0 in seqs:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{field} start at 1; 0 is not a seq",
                           field=field)
    return seqs


def _ack_response(seqs: Sequence[int], settled: Settled) -> consumers_pb2.AckResponse:
    """One result per requested seq, in request order; a refused seq carries its error."""
    response = consumers_pb2.AckResponse(applied=settled.applied)
    add = response.results.add  # in place: a third of the time of building each and copying
    if not settled.refused:  # the usual (a hot path: every Ack)
        for seq in seqs:
            add().seq = seq  # half the time of add(seq=seq): no keyword arguments to parse
        return response
    refused = {seq: rpc.to_error_pb(error) for seq, error in settled.refused.items()}
    for seq in seqs:
        if seq in refused:
            add(seq=seq, error=refused[seq])
        else:
            add(seq=seq)
    return response


class ConsumerOps:
    def __init__(self, manager: ConsumerManager, *, metadata: ConsumerMetadata,
                 where: Route, subscriptions: StreamSubscriptions | None = None) -> None:
        """`subscriptions`: the streams' open subscriptions served here, against their
        max_subscriptions (None: counted, with no stream limited)."""
        self._manager = manager
        self._metadata = metadata
        self._where = where
        self._subscriptions = subscriptions or StreamSubscriptions(lambda _stream: 0)

    async def _on_primary(self, call: Forward[Resp], request: Any, via: Call,
                          local: Callable[[], Awaitable[Resp]], *, consumer: str = "") -> Resp:
        stream = str(request.stream)

        async def confirmed() -> Resp:
            try:
                return await local()
            except RaftlogError as err:
                raise await self._metadata.confirm(err, stream=stream, consumer=consumer,
                                                   via=via) from None

        return await route.unary(self._where, self._where.primary(stream), call, request, via,
                                 confirmed)

    # ------------------------------------------------------------------ metadata

    async def create(self, request: consumers_pb2.CreateConsumerRequest, via: Call
                     ) -> consumers_pb2.ConsumerInfo:
        _names(request.stream)
        auth.current().require_admin("consumer")
        return await self._on_primary(
            canonical.CREATE_CONSUMER, request, via,
            lambda: self._metadata.create_consumer(request.stream, request.config, via))

    async def delete(self, request: consumers_pb2.DeleteConsumerRequest, via: Call
                     ) -> consumers_pb2.DeleteConsumerResponse:
        _names(request.stream, request.consumer)
        auth.current().require_admin("consumer")

        async def local() -> consumers_pb2.DeleteConsumerResponse:
            await self._metadata.delete_consumer(request.stream, request.consumer, via)
            return consumers_pb2.DeleteConsumerResponse()

        return await self._on_primary(canonical.DELETE_CONSUMER, request, via, local,
                                      consumer=request.consumer)

    async def list(self, request: consumers_pb2.ListConsumersRequest, via: Call
                   ) -> consumers_pb2.ListConsumersResponse:
        _names(request.stream)

        async def local() -> consumers_pb2.ListConsumersResponse:
            return consumers_pb2.ListConsumersResponse(
                consumers=self._manager.list(request.stream))

        return await self._on_primary(canonical.LIST_CONSUMERS, request, via, local)

    async def info(self, request: consumers_pb2.GetConsumerInfoRequest, via: Call
                   ) -> consumers_pb2.ConsumerInfo:
        _names(request.stream, request.consumer)

        async def local() -> consumers_pb2.ConsumerInfo:
            return self._manager.info(request.stream, request.consumer)

        return await self._on_primary(canonical.GET_CONSUMER_INFO, request, via, local,
                                      consumer=request.consumer)

    # ------------------------------------------------------------------ delivery

    async def fetch(self, request: consumers_pb2.FetchRequest, via: Call
                    ) -> consumers_pb2.FetchResponse:
        _names(request.stream, request.consumer)
        auth.current().require_subscribe(request.stream, request.consumer)
        batch = at_most("batch", request.batch or 1, high=limits.fetch_batch_max)
        max_wait_ms = at_most("max_wait_ms", request.max_wait_ms, high=limits.fetch_wait_ms_max)
        acks = _seqs(request.ack_seqs, field="ack_seqs") if request.ack_seqs else ()

        async def local() -> consumers_pb2.FetchResponse:
            response = consumers_pb2.FetchResponse()
            if acks:  # before collecting: they free max_ack_pending room for this fetch
                response.acks.CopyFrom(_ack_response(acks, self._manager.ack_behind(
                    request.stream, request.consumer, acks)))
            await self._manager.fetch(request.stream, request.consumer, batch=batch,
                                      max_wait_ms=max_wait_ms, into=response.messages)
            return response

        return await self._on_primary(canonical.FETCH, request, via, local,
                                      consumer=request.consumer)

    async def _settle(self, call: Forward[consumers_pb2.AckResponse], request: Any, via: Call,
                      settle: Callable[[str, str, Sequence[int]], Awaitable[Settled]]
                      ) -> consumers_pb2.AckResponse:
        """Ack, Nak, Term or InProgress: one result per requested seq, in request order."""
        _names(request.stream, request.consumer)
        auth.current().require_subscribe(request.stream, request.consumer)
        seqs = _seqs(request.seqs)

        async def local() -> consumers_pb2.AckResponse:
            return _ack_response(seqs, await settle(request.stream, request.consumer, seqs))

        return await self._on_primary(call, request, via, local, consumer=request.consumer)

    async def ack(self, request: consumers_pb2.AckRequest, via: Call
                  ) -> consumers_pb2.AckResponse:
        return await self._settle(canonical.ACK, request, via, self._manager.ack)

    async def nak(self, request: consumers_pb2.NakRequest, via: Call
                  ) -> consumers_pb2.AckResponse:
        _names(request.stream, request.consumer)
        delay_ms = at_most("delay_ms", request.delay_ms, high=limits.nak_delay_ms_max)

        async def nak(stream: str, consumer: str, seqs: Sequence[int]) -> Settled:
            return await self._manager.nak(stream, consumer, seqs, delay_ms=delay_ms)

        return await self._settle(canonical.NAK, request, via, nak)

    async def term(self, request: consumers_pb2.TermRequest, via: Call
                   ) -> consumers_pb2.AckResponse:
        return await self._settle(canonical.TERM, request, via, self._manager.term)

    async def in_progress(self, request: consumers_pb2.InProgressRequest, via: Call
                          ) -> consumers_pb2.AckResponse:
        return await self._settle(canonical.IN_PROGRESS, request, via,
                                  self._manager.in_progress)

    async def subscribe(self, request: consumers_pb2.SubscribeRequest, via: Call
                        ) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        """Events as Subscription describes them, from the stream's primary."""
        _names(request.stream, request.consumer)
        auth.current().require_subscribe(request.stream, request.consumer)
        subscription = Subscription(self._manager, request, confirm=self._confirm_gone(via))

        async def local() -> AsyncIterator[consumers_pb2.SubscribeEvent]:
            # Served here, on the primary: the stream's slot (a relaying node takes none).
            give_back = self._subscriptions.take(request.stream)
            try:
                async for event in subscription.events():
                    yield event
            except RaftlogError as err:
                raise await self._metadata.confirm(err, stream=request.stream,
                                                   consumer=request.consumer, via=via) from None
            finally:
                give_back()

        events = route.server_stream(self._where, self._where.primary(request.stream),
                                     canonical.SUBSCRIBE, request, via, local)
        try:
            async for event in events:
                yield event
        finally:  # closed with this one: a closed Subscribe gives its stream's slot back now
            await route.maybe_aclose(events)

    def _confirm_gone(self, via: Call) -> Callable[[RaftlogError, str, str],
                                                    Awaitable[RaftlogError]]:
        async def confirm(error: RaftlogError, stream: str, consumer: str) -> RaftlogError:
            return await self._metadata.confirm(error, stream=stream, consumer=consumer,
                                                via=via)
        return confirm
