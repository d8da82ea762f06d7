"""A subscription on the stream's primary: messages as they come, a heartbeat per idle
`heartbeat_ms`, and a Stopped event when the consumer or its stream goes away (or, if asked,
once it is drained).

The caller's reading paces it: the loop waits while the event it yielded has not been taken,
so a client that does not read holds the loop, and what it costs the node is one fetch: at
most limits.subscribe_buffer_bytes_max (or one message).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.v1 import consumers_pb2

STOPPED_DRAINED = "drained"
STOPPED_STREAM_DELETED = "stream deleted"
STOPPED_CONSUMER_DELETED = "consumer deleted"

# (error, stream, consumer) -> the error to act on: a NOT_FOUND only once it is certain.
Confirm = Callable[[RaftlogError, str, str], Awaitable[RaftlogError]]


def at_most(field: str, value: int, *, high: int) -> int:
    if value > high:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{field} may be at most {high}, not {value}",
                           field=field, limit=high)
    return value


def heartbeat_ms(value: int) -> int:
    chosen = value or limits.subscribe_heartbeat_ms_default
    if chosen < limits.subscribe_heartbeat_ms_min:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "heartbeat_ms must be at least "
                           f"{limits.subscribe_heartbeat_ms_min}", field="heartbeat_ms",
                           limit=limits.subscribe_heartbeat_ms_min)
    return at_most("heartbeat_ms", chosen, high=limits.fetch_wait_ms_max)


def _stopped(reason: str) -> consumers_pb2.SubscribeEvent:
    return consumers_pb2.SubscribeEvent(stopped=consumers_pb2.Stopped(reason=reason))


def _gone_reason(exc: RaftlogError) -> str | None:
    if exc.reason == Reason.STREAM_NOT_FOUND:
        return STOPPED_STREAM_DELETED
    if exc.reason == Reason.CONSUMER_NOT_FOUND:
        return STOPPED_CONSUMER_DELETED
    return None


class Subscription:
    def __init__(self, manager: ConsumerManager, request: consumers_pb2.SubscribeRequest, *,
                 confirm: Confirm) -> None:
        """Checks the request's limits (INVALID_ARGUMENT before any event)."""
        self._manager = manager
        self._request = request
        self._confirm = confirm
        self._batch = at_most("batch", request.batch or limits.subscribe_batch_default,
                               high=limits.fetch_batch_max)
        self._heartbeat_ms = heartbeat_ms(request.heartbeat_ms)

    async def events(self) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        request, manager = self._request, self._manager
        stream, name = request.stream, request.consumer
        manager.info(stream, name)  # NOT_FOUND before any event
        while True:
            try:
                if request.stop_when_empty and manager.is_drained(stream, name):
                    yield _stopped(STOPPED_DRAINED)
                    return
                messages = await manager.fetch(
                    stream, name, batch=self._batch, max_wait_ms=self._heartbeat_ms,
                    bytes_max=limits.subscribe_buffer_bytes_max)
                commit_seq = manager.commit_seq(stream)
            except RaftlogError as exc:
                confirmed = await self._confirm(exc, stream, name)
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
