"""Publishing: one message, a batch of one stream, and a stream of messages for any streams.

A stream of messages served here is staged as it arrives (one WriteBatch per run of the same
stream) and awaits durability once per window of limits.stream_publish_inflight_max; in a
cluster the messages are gathered per destination (here, or a node serving their stream) and
sent on in client streams of bounded size (the split), and every message gets its own result in
order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_publish import Appended
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import canonical, route
from raftlog.node.ops.batches import expand_results
from raftlog.node.ops.quotas import QuotaBook, Rates, stream_key
from raftlog.node.ops.route import Route
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

Indexed = list[tuple[int, streams_pb2.PublishRequest]]
# Scheduling is served by Publish only (ops/schedule.py): a streamed message naming a
# deliver_at_ms fails alone rather than entering its stream at once.
_NOT_STREAMED = RaftlogError(Reason.INVALID_ARGUMENT, "deliver_at_ms is served by Publish, not "
                             "PublishStream", field="deliver_at_ms")


def ack(stream: str, outcome: Appended, *, primary: str) -> streams_pb2.PublishAck:
    return streams_pb2.PublishAck(stream=stream, seq=outcome.seq, duplicate=outcome.duplicate,
                                  epoch=outcome.epoch, primary=primary)


def result(stream: str, outcome: Appended | RaftlogError, *, primary: str
           ) -> streams_pb2.PublishResult:
    if isinstance(outcome, RaftlogError):
        return streams_pb2.PublishResult(error=rpc.to_error_pb(outcome))
    return streams_pb2.PublishResult(ack=ack(stream, outcome, primary=primary))


def batch_response(stream_names: Sequence[str], outcomes: Sequence[Appended | RaftlogError],
                   *, primary: str) -> streams_pb2.PublishBatchResponse:
    """The compact form (first_seq) when every message got the next new seq of one stream in
    one epoch; else one PublishResult per message. `primary`: this node's id."""
    if outcomes and stream_names and all(name == stream_names[0] for name in stream_names):
        first = outcomes[0]
        if isinstance(first, Appended) and all(
            isinstance(outcome, Appended) and not outcome.duplicate
            and outcome.seq == first.seq + index and outcome.epoch == first.epoch
            for index, outcome in enumerate(outcomes)
        ):
            return streams_pb2.PublishBatchResponse(
                acked=len(outcomes), first_seq=first.seq, stream=stream_names[0],
                epoch=first.epoch, primary=primary)
    results = [result(name, outcome, primary=primary)
               for name, outcome in zip(stream_names, outcomes, strict=True)]
    failed = sum(1 for outcome in outcomes if isinstance(outcome, RaftlogError))
    return streams_pb2.PublishBatchResponse(
        results=results, acked=len(outcomes) - failed, failed=failed)


def _fail_uncommitted(
    stream_names: Sequence[str], outcomes: Sequence[Appended | RaftlogError],
    confirmed: dict[str, int], failed: dict[str, RaftlogError],
) -> list[Appended | RaftlogError]:
    """A message above its stream's confirmed commit, in a stream whose commit failed, gets
    that failure instead of a seq: it is not acknowledged (it may still be committed later or
    truncated; a retry with its msg_id gets the original seq if it was kept)."""
    if not failed:
        return list(outcomes)
    return [failed[name] if (name in failed and isinstance(outcome, Appended)
                             and outcome.seq > confirmed.get(name, 0)) else outcome
            for name, outcome in zip(stream_names, outcomes, strict=True)]


def check_batch(entries: int) -> None:
    if entries > limits.batch_messages_max:
        raise RaftlogError(Reason.BATCH_TOO_LARGE,
                           f"a batch holds at most {limits.batch_messages_max} messages",
                           limit=limits.batch_messages_max)


class LocalStream:
    """One PublishStream call's messages for streams served here."""

    def __init__(self, engine: StreamEngine, *, primary: str,
                 quotas: QuotaBook | None = None) -> None:
        """`primary`: this node's id, for the acknowledgements; `quotas`: the node's publish
        quotas (none: not checked)."""
        self._engine = engine
        self._primary = primary
        self._quotas = quotas
        self._names: list[str] = []
        self._outcomes: list[Appended | RaftlogError] = []
        self._pending: dict[str, int] = {}
        self._confirmed: dict[str, int] = {}
        self._failed: dict[str, RaftlogError] = {}

    async def run(self, requests: AsyncIterator[streams_pb2.PublishRequest]
                  ) -> streams_pb2.PublishBatchResponse:
        chunk: list[streams_pb2.PublishRequest] = []
        staged = 0
        async for request in requests:
            if request.deliver_at_ms:
                staged += self._stage(chunk) if chunk else 0
                chunk = []
                self._names.append(request.stream)
                self._outcomes.append(_NOT_STREAMED)
                continue
            if chunk and (request.stream != chunk[0].stream
                          or len(chunk) >= limits.stream_publish_chunk_max):
                staged += self._stage(chunk)
                chunk = []
            chunk.append(request)
            if staged >= limits.stream_publish_inflight_max:
                await self._commit()
                staged = 0
        if chunk:
            self._stage(chunk)
        await self._commit()
        return batch_response(self._names, _fail_uncommitted(
            self._names, self._outcomes, self._confirmed, self._failed), primary=self._primary)

    def _stage(self, chunk: list[streams_pb2.PublishRequest]) -> int:
        """Stages a run of messages for one stream; returns how many were staged."""
        name = chunk[0].stream
        self._names.extend([name] * len(chunk))
        try:
            subjects.validate_name(name, what="stream")
            stream = self._engine.get(name)
            refused = self._refused(name, stream.config, chunk)
            admitted = chunk[:len(chunk) - len(refused)]
            results, wait_seq = stream.publish_staged(admitted) if admitted else ([], 0)
        except RaftlogError as err:
            self._outcomes.extend([err] * len(chunk))
            return 0
        self._outcomes.extend(results)
        self._outcomes.extend(refused)
        if wait_seq:
            self._pending[name] = max(self._pending.get(name, 0), wait_seq)
        return len(admitted)

    def _refused(self, name: str, config: types_pb2.StreamConfig,
                 chunk: list[streams_pb2.PublishRequest]) -> list[RaftlogError]:
        """The refusals of the tail of `chunk` past the stream's quotas (quotas.py admits a
        prefix of a run, message by message)."""
        rates = Rates.of_stream(config)
        if self._quotas is None or not rates:
            return []
        outcomes = self._quotas.admit_each(stream_key(name), rates, chunk)
        return [err for err in outcomes if err is not None]

    async def _commit(self) -> None:
        """Awaits the commit of each stream's staged messages. A stream whose commit fails
        (NO_QUORUM, NOT_PRIMARY...) is noted in `_failed`, and the other streams go on."""
        for name, wait_seq in self._pending.items():
            if name in self._failed:
                continue
            try:
                await self._engine.commit(name, wait_seq)
            except RaftlogError as err:
                self._failed[name] = err
            else:
                self._confirmed[name] = max(self._confirmed.get(name, 0), wait_seq)
        self._pending.clear()


async def _items(items: Indexed) -> AsyncIterator[streams_pb2.PublishRequest]:
    for _, request in items:
        yield request


async def split_stream(engine: StreamEngine, where: Route,
                       requests: AsyncIterator[streams_pb2.PublishRequest], via: Call,
                       *, quotas: QuotaBook | None = None
                       ) -> streams_pb2.PublishBatchResponse:
    """Messages for streams served here are published here; the rest are gathered per node
    and sent to it in PublishStream calls. A destination's gathered messages go as soon as they
    reach limits.stream_split_messages_max or limits.stream_split_bytes_max (the call reads no
    further meanwhile), the rest at the end of the call: what a call holds is bounded."""
    results: list[streams_pb2.PublishResult | None] = []
    # Gathered messages and their bytes, by destination (None: here).
    gathered: dict[str | None, Indexed] = {}
    gathered_bytes: dict[str | None, int] = {}

    async def send(address: str | None, items: Indexed) -> None:
        if address is None:
            reply = await LocalStream(engine, primary=where.node_id,
                                      quotas=quotas).run(_items(items))
            _place(items, expand_results(reply), results)
            return
        try:
            reply = await route.client_stream(where, address, canonical.PUBLISH_STREAM,
                                              [request for _, request in items], via)
            outcomes = expand_results(reply)
        except RaftlogError as err:
            outcomes = [streams_pb2.PublishResult(error=rpc.to_error_pb(err))] * len(items)
        _place(items, outcomes, results)

    async for request in requests:
        index = len(results)
        results.append(None)
        try:
            address = where.primary(request.stream)
        except RaftlogError as err:
            results[index] = streams_pb2.PublishResult(error=rpc.to_error_pb(err))
            continue
        items = gathered.setdefault(address, [])
        items.append((index, request))
        gathered_bytes[address] = gathered_bytes.get(address, 0) + request.ByteSize()
        if len(items) >= limits.stream_split_messages_max or \
                gathered_bytes[address] >= limits.stream_split_bytes_max:
            del gathered[address], gathered_bytes[address]
            await send(address, items)

    await asyncio.gather(*(send(address, items) for address, items in gathered.items()))
    final = [r or streams_pb2.PublishResult() for r in results]
    failed = sum(1 for r in final if r.HasField("error"))
    return streams_pb2.PublishBatchResponse(results=final, acked=len(final) - failed,
                                            failed=failed)


def _place(items: Indexed, outcomes: list[streams_pb2.PublishResult],
           results: list[streams_pb2.PublishResult | None]) -> None:
    for (index, _), outcome in zip(items, outcomes, strict=True):
        results[index] = outcome
