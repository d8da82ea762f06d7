"""The Streams gRPC service: request checks and conversion around the StreamEngine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_publish import Appended
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.transport import rpc
from raftlog.v1 import streams_pb2, streams_pb2_grpc, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]


def _result(stream: str, outcome: Appended | RaftlogError) -> streams_pb2.PublishResult:
    if isinstance(outcome, RaftlogError):
        return streams_pb2.PublishResult(error=rpc.to_error_pb(outcome))
    return streams_pb2.PublishResult(
        ack=streams_pb2.PublishAck(stream=stream, seq=outcome.seq, duplicate=outcome.duplicate)
    )


def _batch_response(
    stream_names: Sequence[str], outcomes: Sequence[Appended | RaftlogError]
) -> streams_pb2.PublishBatchResponse:
    """The compact form (first_seq) when every message got the next new seq of one stream;
    else one PublishResult per message."""
    if outcomes and stream_names and all(name == stream_names[0] for name in stream_names):
        first = outcomes[0]
        if isinstance(first, Appended) and all(
            isinstance(outcome, Appended) and not outcome.duplicate
            and outcome.seq == first.seq + index for index, outcome in enumerate(outcomes)
        ):
            return streams_pb2.PublishBatchResponse(
                acked=len(outcomes), first_seq=first.seq, stream=stream_names[0])
    results = [_result(name, outcome) for name, outcome in zip(stream_names, outcomes,
                                                                strict=True)]
    failed = sum(1 for outcome in outcomes if isinstance(outcome, RaftlogError))
    return streams_pb2.PublishBatchResponse(
        results=results, acked=len(outcomes) - failed, failed=failed
    )


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


def _limit(value: int, *, default: int, maximum: int, what: str) -> int:
    if value > maximum:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} may be at most {maximum}",
                           limit=maximum)
    return value or default


class StreamsService(streams_pb2_grpc.StreamsServicer):
    def __init__(self, engine: StreamEngine) -> None:
        self._engine = engine

    def _stream(self, name: str) -> Any:
        subjects.validate_name(name, what="stream")
        return self._engine.get(name)

    @rpc.unary
    async def CreateStream(self, request: streams_pb2.CreateStreamRequest,
                           context: Context) -> types_pb2.StreamInfo:
        return await self._engine.create(request.config)

    @rpc.unary
    async def UpdateStream(self, request: streams_pb2.UpdateStreamRequest,
                           context: Context) -> streams_pb2.UpdateStreamResponse:
        subjects.validate_name(request.name, what="stream")
        info, pruned = await self._engine.update(request)
        return streams_pb2.UpdateStreamResponse(info=info, pruned=pruned)

    @rpc.unary
    async def DeleteStream(self, request: streams_pb2.DeleteStreamRequest,
                           context: Context) -> streams_pb2.DeleteStreamResponse:
        subjects.validate_name(request.name, what="stream")
        await self._engine.delete(request.name)
        return streams_pb2.DeleteStreamResponse()

    @rpc.unary
    async def GetStreamInfo(self, request: streams_pb2.GetStreamInfoRequest,
                            context: Context) -> types_pb2.StreamInfo:
        subjects.validate_name(request.name, what="stream")
        return self._engine.info(request.name)

    @rpc.unary
    async def ListStreams(self, request: streams_pb2.ListStreamsRequest,
                          context: Context) -> streams_pb2.ListStreamsResponse:
        return streams_pb2.ListStreamsResponse(streams=self._engine.infos(request.prefix))

    @rpc.unary
    async def PurgeStream(self, request: streams_pb2.PurgeStreamRequest,
                          context: Context) -> streams_pb2.PurgeStreamResponse:
        subjects.validate_name(request.name, what="stream")
        if request.subject:
            subjects.validate_pattern(request.subject)
        return streams_pb2.PurgeStreamResponse(purged=await self._engine.purge(request))

    @rpc.unary
    async def GetMessage(self, request: streams_pb2.GetMessageRequest,
                         context: Context) -> types_pb2.Message:
        stream = self._stream(request.stream)
        if request.seq == 0:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "seq must be at least 1")
        message: types_pb2.Message = stream.get_message(request.seq)
        return message

    @rpc.unary
    async def ReadLatestAtSubject(self, request: streams_pb2.ReadLatestAtSubjectRequest,
                                  context: Context) -> types_pb2.Message:
        stream = self._stream(request.stream)
        subjects.validate_subject(request.subject)
        message: types_pb2.Message = stream.latest_at_subject(request.subject)
        return message

    @rpc.unary
    async def ListSubjectsByPrefix(self, request: streams_pb2.ListSubjectsByPrefixRequest,
                                   context: Context) -> streams_pb2.ListSubjectsByPrefixResponse:
        stream = self._stream(request.stream)
        limit = _limit(request.limit, default=limits.list_subjects_limit_default,
                       maximum=limits.list_subjects_limit_max, what="limit")
        found, truncated = stream.subjects_with_prefix(request.prefix, limit=limit)
        return streams_pb2.ListSubjectsByPrefixResponse(subjects=found, truncated=truncated)

    @rpc.unary
    async def ScanExactAtSubject(self, request: streams_pb2.ScanExactAtSubjectRequest,
                                 context: Context) -> streams_pb2.ScanExactAtSubjectResponse:
        stream = self._stream(request.stream)
        subjects.validate_subject(request.subject)
        limit = _limit(request.limit, default=limits.scan_limit_default,
                       maximum=limits.scan_limit_max, what="limit")
        messages, next_seq = stream.scan_subject(request.subject, from_seq=request.from_seq,
                                                 limit=limit)
        return streams_pb2.ScanExactAtSubjectResponse(messages=messages, next_seq=next_seq)

    @rpc.unary
    async def Publish(self, request: streams_pb2.PublishRequest,
                      context: Context) -> streams_pb2.PublishAck:
        subjects.validate_name(request.stream, what="stream")
        (outcome,) = await self._engine.publish(request.stream, [request])
        if isinstance(outcome, RaftlogError):
            raise outcome
        return streams_pb2.PublishAck(stream=request.stream, seq=outcome.seq,
                                      duplicate=outcome.duplicate)

    @rpc.unary
    async def PublishBatch(self, request: streams_pb2.PublishBatchRequest,
                           context: Context) -> streams_pb2.PublishBatchResponse:
        subjects.validate_name(request.stream, what="stream")
        if len(request.entries) > limits.batch_messages_max:
            raise RaftlogError(Reason.BATCH_TOO_LARGE,
                               f"a batch holds at most {limits.batch_messages_max} messages",
                               limit=limits.batch_messages_max)
        outcomes = await self._engine.publish(request.stream, request.entries)
        return _batch_response([request.stream] * len(outcomes), outcomes)

    @rpc.unary
    async def PublishStream(self, request_iterator: AsyncIterator[streams_pb2.PublishRequest],
                            context: Context) -> streams_pb2.PublishBatchResponse:
        return await self._publish_stream(request_iterator)

    async def _publish_stream(
        self, requests: AsyncIterator[streams_pb2.PublishRequest]
    ) -> streams_pb2.PublishBatchResponse:
        """Stages messages as they arrive (one WriteBatch per run of the same stream), and
        awaits durability once per window of limits.stream_publish_inflight_max."""
        names: list[str] = []
        outcomes: list[Appended | RaftlogError] = []
        pending: dict[str, int] = {}
        confirmed: dict[str, int] = {}
        failed: dict[str, RaftlogError] = {}
        chunk: list[streams_pb2.PublishRequest] = []
        staged = 0
        async for request in requests:
            if chunk and (request.stream != chunk[0].stream
                          or len(chunk) >= limits.stream_publish_chunk_max):
                staged += self._stage(chunk, names, outcomes, pending)
                chunk = []
            chunk.append(request)
            if staged >= limits.stream_publish_inflight_max:
                await self._commit(pending, confirmed, failed)
                staged = 0
        if chunk:
            self._stage(chunk, names, outcomes, pending)
        await self._commit(pending, confirmed, failed)
        return _batch_response(names, _fail_uncommitted(names, outcomes, confirmed, failed))

    def _stage(self, chunk: list[streams_pb2.PublishRequest], names: list[str],
               outcomes: list[Appended | RaftlogError], pending: dict[str, int]) -> int:
        """Stages a run of messages for one stream; returns how many were staged."""
        name = chunk[0].stream
        names.extend([name] * len(chunk))
        try:
            subjects.validate_name(name, what="stream")
            results, wait_seq = self._engine.get(name).publish_staged(chunk)
        except RaftlogError as err:
            outcomes.extend([err] * len(chunk))
            return 0
        outcomes.extend(results)
        if wait_seq:
            pending[name] = max(pending.get(name, 0), wait_seq)
        return len(chunk)

    async def _commit(self, pending: dict[str, int], confirmed: dict[str, int],
                      failed: dict[str, RaftlogError]) -> None:
        """Awaits the commit of each stream's staged messages; `confirmed` holds the seq each
        stream is known committed through. A stream whose commit fails (NO_QUORUM,
        NOT_PRIMARY...) is noted in `failed`, and the other streams of the call go on."""
        for name, wait_seq in pending.items():
            if name in failed:
                continue
            try:
                await self._engine.commit(name, wait_seq)
            except RaftlogError as err:
                failed[name] = err
            else:
                confirmed[name] = max(confirmed.get(name, 0), wait_seq)
        pending.clear()
