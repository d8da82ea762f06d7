"""Stream operations, whatever protocol asked: check the request, then serve it here or send it
to the stream's primary (route.py). A per-stream failure that denies existence is confirmed by
the metadata rules before it is answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream import Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import canonical, route
from raftlog.node.ops.metadata import StreamMetadata
from raftlog.node.ops.publish import (
    LocalStream,
    ack,
    batch_response,
    check_batch,
    split_stream,
)
from raftlog.node.ops.route import Route
from raftlog.node.transport.calls import Call
from raftlog.node.transport.forwarding import Forward
from raftlog.v1 import streams_pb2, types_pb2

Resp = TypeVar("Resp")


def _limit(value: int, *, default: int, maximum: int, what: str) -> int:
    if value > maximum:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} may be at most {maximum}",
                           limit=maximum)
    return value or default


class StreamOps:
    def __init__(self, engine: StreamEngine, *, metadata: StreamMetadata, where: Route) -> None:
        self._engine = engine
        self._metadata = metadata
        self._where = where

    async def _on_primary(self, call: Forward[Resp], stream: str, request: Any, via: Call,
                          local: Callable[[], Awaitable[Resp]]) -> Resp:
        """`local` on the stream's primary (here or forwarded there), its NOT_FOUND
        confirmed."""
        async def confirmed() -> Resp:
            try:
                return await local()
            except RaftlogError as err:
                raise await self._metadata.confirm(err, stream=stream, consumer="",
                                                   via=via) from None

        return await route.unary(self._where, self._where.primary(stream), call, request, via,
                                 confirmed)

    def _stream(self, name: str) -> Stream:
        return self._engine.get(name)

    # ------------------------------------------------------------------ metadata

    async def create(self, request: streams_pb2.CreateStreamRequest, via: Call
                     ) -> types_pb2.StreamInfo:
        name = request.config.name
        address = self._where.primary(name)  # a new stream's ring owner creates it
        return await route.unary(self._where, address, canonical.CREATE_STREAM, request, via,
                                 lambda: self._metadata.create_stream(request.config, via))

    async def update(self, request: streams_pb2.UpdateStreamRequest, via: Call
                     ) -> streams_pb2.UpdateStreamResponse:
        subjects.validate_name(request.name, what="stream")
        return await self._on_primary(canonical.UPDATE_STREAM, request.name, request, via,
                                      lambda: self._metadata.update_stream(request, via))

    async def delete(self, request: streams_pb2.DeleteStreamRequest, via: Call
                     ) -> streams_pb2.DeleteStreamResponse:
        subjects.validate_name(request.name, what="stream")

        async def local() -> streams_pb2.DeleteStreamResponse:
            await self._metadata.delete_stream(request.name, via)
            return streams_pb2.DeleteStreamResponse()

        return await self._on_primary(canonical.DELETE_STREAM, request.name, request, via,
                                      local)

    async def list(self, request: streams_pb2.ListStreamsRequest, via: Call
                   ) -> streams_pb2.ListStreamsResponse:
        return streams_pb2.ListStreamsResponse(
            streams=await self._metadata.list_streams(request.prefix, via))

    # ------------------------------------------------------------------ reads

    async def info(self, request: streams_pb2.GetStreamInfoRequest, via: Call
                   ) -> types_pb2.StreamInfo:
        subjects.validate_name(request.name, what="stream")

        async def local() -> types_pb2.StreamInfo:
            # Its last_seq is a read of the log: served under the same rules as messages.
            self._engine.get(request.name).check_readable()
            return self._engine.info(request.name)

        return await self._on_primary(canonical.GET_STREAM_INFO, request.name, request, via,
                                      local)

    async def purge(self, request: streams_pb2.PurgeStreamRequest, via: Call
                    ) -> streams_pb2.PurgeStreamResponse:
        subjects.validate_name(request.name, what="stream")
        if request.subject:
            subjects.validate_pattern(request.subject)

        async def local() -> streams_pb2.PurgeStreamResponse:
            return streams_pb2.PurgeStreamResponse(purged=await self._engine.purge(request))

        return await self._on_primary(canonical.PURGE_STREAM, request.name, request, via,
                                      local)

    async def get_message(self, request: streams_pb2.GetMessageRequest, via: Call
                          ) -> types_pb2.Message:
        subjects.validate_name(request.stream, what="stream")
        if request.seq == 0:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "seq must be at least 1")

        async def local() -> types_pb2.Message:
            message: types_pb2.Message = self._stream(request.stream).get_message(request.seq)
            return message

        return await self._on_primary(canonical.GET_MESSAGE, request.stream, request, via,
                                      local)

    async def read_latest(self, request: streams_pb2.ReadLatestAtSubjectRequest, via: Call
                          ) -> types_pb2.Message:
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_subject(request.subject)

        async def local() -> types_pb2.Message:
            stream = self._stream(request.stream)
            message: types_pb2.Message = stream.latest_at_subject(request.subject)
            return message

        return await self._on_primary(canonical.READ_LATEST, request.stream, request, via,
                                      local)

    async def list_subjects(self, request: streams_pb2.ListSubjectsByPrefixRequest, via: Call
                            ) -> streams_pb2.ListSubjectsByPrefixResponse:
        subjects.validate_name(request.stream, what="stream")
        limit = _limit(request.limit, default=limits.list_subjects_limit_default,
                       maximum=limits.list_subjects_limit_max, what="limit")

        async def local() -> streams_pb2.ListSubjectsByPrefixResponse:
            found, truncated = self._stream(request.stream).subjects_with_prefix(
                request.prefix, limit=limit)
            return streams_pb2.ListSubjectsByPrefixResponse(subjects=found, truncated=truncated)

        return await self._on_primary(canonical.LIST_SUBJECTS, request.stream, request, via,
                                      local)

    async def scan_subject(self, request: streams_pb2.ScanExactAtSubjectRequest, via: Call
                           ) -> streams_pb2.ScanExactAtSubjectResponse:
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_subject(request.subject)
        limit = _limit(request.limit, default=limits.scan_limit_default,
                       maximum=limits.scan_limit_max, what="limit")

        async def local() -> streams_pb2.ScanExactAtSubjectResponse:
            messages, next_seq = self._stream(request.stream).scan_subject(
                request.subject, from_seq=request.from_seq, limit=limit)
            return streams_pb2.ScanExactAtSubjectResponse(messages=messages, next_seq=next_seq)

        return await self._on_primary(canonical.SCAN_SUBJECT, request.stream, request, via,
                                      local)

    # ------------------------------------------------------------------ publish

    async def publish(self, request: streams_pb2.PublishRequest, via: Call
                      ) -> streams_pb2.PublishAck:
        subjects.validate_name(request.stream, what="stream")

        async def local() -> streams_pb2.PublishAck:
            (outcome,) = await self._engine.publish(request.stream, [request])
            if isinstance(outcome, RaftlogError):
                raise outcome
            return ack(request.stream, outcome, primary=self._where.node_id)

        return await self._on_primary(canonical.PUBLISH, request.stream, request, via, local)

    async def publish_batch(self, request: streams_pb2.PublishBatchRequest, via: Call
                            ) -> streams_pb2.PublishBatchResponse:
        subjects.validate_name(request.stream, what="stream")
        check_batch(len(request.entries))

        async def local() -> streams_pb2.PublishBatchResponse:
            outcomes = await self._engine.publish(request.stream, request.entries)
            return batch_response([request.stream] * len(outcomes), outcomes,
                                  primary=self._where.node_id)

        return await self._on_primary(canonical.PUBLISH_BATCH, request.stream, request, via,
                                      local)

    async def publish_stream(self, requests: AsyncIterator[streams_pb2.PublishRequest],
                             via: Call) -> streams_pb2.PublishBatchResponse:
        """One result per message in order; messages for streams served elsewhere go there."""
        if self._where.forwarder is None:
            return await LocalStream(self._engine, primary=self._where.node_id).run(requests)
        return await split_stream(self._engine, self._where, requests, via)
