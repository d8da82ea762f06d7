"""Stream operations, whatever protocol asked: check the request, then serve it here or send it
to the stream's primary (route.py). A per-stream failure that denies existence is confirmed by
the metadata rules before it is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from raftlog.base import limits, subjects
from raftlog.base.clock import SystemClock
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
from raftlog.node.ops.publish_frames import FramePipeline
from raftlog.node.ops.quotas import (
    QuotaBook,
    Rates,
    admit_caller,
    message_bytes,
    stream_key,
)
from raftlog.node.ops.reads import read_messages
from raftlog.node.ops.route import Route
from raftlog.node.ops.source_status import TailRegistry
from raftlog.node.transport import auth
from raftlog.node.transport.calls import LOCAL_HEADER, Call
from raftlog.node.transport.forwarding import Forward
from raftlog.v1 import streams_pb2, types_pb2

if TYPE_CHECKING:
    from raftlog.node.ops.schedule import ScheduleOps

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
        self.tails = TailRegistry()  # the source tails this node runs (sources.py fills it)
        # Publishes with a future deliver_at_ms (schedule.py; operations.py sets it).
        self.schedule: ScheduleOps | None = None
        # The publish quotas of the streams served here (quotas.py, docs/quotas.md).
        self.quotas = QuotaBook(SystemClock())

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

    def _admit(self, name: str, drafts: Sequence[Any]) -> None:
        """Charges a publish to its stream's quotas, whole (RATE_LIMITED: nothing of it is
        stored); on the stream's primary, before anything is staged."""
        rates = Rates.of_stream(self._stream(name).config)
        if rates:
            self.quotas.admit(stream_key(name), rates, msgs=len(drafts),
                              bytes_total=sum(message_bytes(d) for d in drafts))

    def scheduled(self) -> ScheduleOps:
        """The scheduled-message operations (operations.py always sets them)."""
        if self.schedule is None:
            raise RaftlogError(Reason.INTERNAL, "this node does not schedule messages")
        return self.schedule

    # ------------------------------------------------------------------ metadata

    async def create(self, request: streams_pb2.CreateStreamRequest, via: Call
                     ) -> types_pb2.StreamInfo:
        name = request.config.name
        auth.current().require_admin("stream")
        address = self._where.primary(name)  # a new stream's ring owner creates it
        return await route.unary(self._where, address, canonical.CREATE_STREAM, request, via,
                                 lambda: self._metadata.create_stream(request.config, via))

    async def update(self, request: streams_pb2.UpdateStreamRequest, via: Call
                     ) -> streams_pb2.UpdateStreamResponse:
        subjects.validate_name(request.name, what="stream")
        auth.current().require_admin("stream")
        return await self._on_primary(canonical.UPDATE_STREAM, request.name, request, via,
                                      lambda: self._metadata.update_stream(request, via))

    async def delete(self, request: streams_pb2.DeleteStreamRequest, via: Call
                     ) -> streams_pb2.DeleteStreamResponse:
        subjects.validate_name(request.name, what="stream")
        auth.current().require_admin("stream")

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
            info = self._engine.info(request.name)
            info.sources.extend(self.tails.statuses(request.name))
            return info

        return await self._on_primary(canonical.GET_STREAM_INFO, request.name, request, via,
                                      local)

    async def purge(self, request: streams_pb2.PurgeStreamRequest, via: Call
                    ) -> streams_pb2.PurgeStreamResponse:
        subjects.validate_name(request.name, what="stream")
        auth.current().require_admin("stream")
        if request.subject:
            subjects.validate_pattern(request.subject)

        async def local() -> streams_pb2.PurgeStreamResponse:
            return streams_pb2.PurgeStreamResponse(purged=await self._engine.purge(request))

        return await self._on_primary(canonical.PURGE_STREAM, request.name, request, via,
                                      local)

    async def get_message(self, request: streams_pb2.GetMessageRequest, via: Call
                          ) -> types_pb2.Message:
        subjects.validate_name(request.stream, what="stream")
        auth.current().require_subscribe(request.stream)
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
        auth.current().require_subject_read(request.subject)

        async def local() -> types_pb2.Message:
            stream = self._stream(request.stream)
            message: types_pb2.Message = stream.latest_at_subject(request.subject)
            return message

        return await self._on_primary(canonical.READ_LATEST, request.stream, request, via,
                                      local)

    async def list_subjects(self, request: streams_pb2.ListSubjectsByPrefixRequest, via: Call
                            ) -> streams_pb2.ListSubjectsByPrefixResponse:
        subjects.validate_name(request.stream, what="stream")
        auth.current().require_subscribe(request.stream)
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
        auth.current().require_subject_read(request.subject)
        limit = _limit(request.limit, default=limits.scan_limit_default,
                       maximum=limits.scan_limit_max, what="limit")

        async def local() -> streams_pb2.ScanExactAtSubjectResponse:
            messages, next_seq = self._stream(request.stream).scan_subject(
                request.subject, from_seq=request.from_seq, limit=limit)
            return streams_pb2.ScanExactAtSubjectResponse(messages=messages, next_seq=next_seq)

        return await self._on_primary(canonical.SCAN_SUBJECT, request.stream, request, via,
                                      local)

    async def read_messages(self, request: streams_pb2.ReadMessagesRequest, via: Call
                            ) -> streams_pb2.ReadMessagesResponse:
        subjects.validate_name(request.stream, what="stream")
        if request.filter_subject:
            auth.current().require_subject_read(request.filter_subject)
        else:
            auth.current().require_subscribe(request.stream)
        if request.filter_subject:
            subjects.validate_pattern(request.filter_subject)
        limit = _limit(request.limit, default=limits.source_read_batch_max,
                       maximum=limits.scan_limit_max, what="limit")
        _limit(request.max_wait_ms, default=0, maximum=limits.fetch_wait_ms_max,
               what="max_wait_ms")

        async def local() -> streams_pb2.ReadMessagesResponse:
            return await read_messages(self._stream(request.stream), request, limit=limit)

        return await self._on_primary(canonical.READ_MESSAGES, request.stream, request, via,
                                      local)

    async def sources(self, request: streams_pb2.GetStreamSourcesRequest, via: Call
                      ) -> streams_pb2.GetStreamSourcesResponse:
        """The tails this node runs and, unless asked for this node only, every other
        member's (each asked at once, for at most limits.fanout_timeout_s)."""
        if request.stream:
            subjects.validate_name(request.stream, what="stream")
        found = list(self.tails.statuses(request.stream))
        forwarder = self._where.forwarder
        others = {node_id: address for node_id, address in self._where.members().items()
                  if node_id != self._where.node_id}
        if via.local_only or forwarder is None or not others:
            return streams_pb2.GetStreamSourcesResponse(sources=found)

        async def ask(address: str) -> list[types_pb2.SourceStatus] | None:
            try:
                reply = await forwarder.unary(
                    address, canonical.GET_STREAM_SOURCES, request, Call(hops=via.hops),
                    timeout_s=min(via.timeout_s(), limits.fanout_timeout_s),
                    headers=((LOCAL_HEADER, "1"),))
            except RaftlogError:
                return None
            return list(reply.sources)

        replies = await asyncio.gather(*(ask(address) for address in others.values()))
        unreachable = []
        for node_id, reply in zip(others, replies, strict=True):
            if reply is None:
                unreachable.append(node_id)
            else:
                found.extend(reply)
        found.sort(key=lambda s: (s.sourcing_stream, s.source_stream, s.node))
        return streams_pb2.GetStreamSourcesResponse(sources=found,
                                                    unreachable=sorted(unreachable))

    # ------------------------------------------------------------------ publish

    async def publish(self, request: streams_pb2.PublishRequest, via: Call
                      ) -> streams_pb2.PublishAck:
        """Answered once the message is durable; one with a future deliver_at_ms is
        scheduled instead (PublishAck.scheduled, docs/scheduled.md)."""
        subjects.validate_name(request.stream, what="stream")
        auth.current().require_publish(request.subject)
        admit_caller(self.quotas, auth.current(), [request])
        if request.deliver_at_ms:
            if self.schedule is None:
                raise RaftlogError(Reason.INVALID_ARGUMENT, "this node does not schedule "
                                   "messages", field="deliver_at_ms")
            scheduled = await self.schedule.maybe_schedule(request, via)
            if scheduled is not None:
                return scheduled
            now = streams_pb2.PublishRequest()
            now.CopyFrom(request)
            now.ClearField("deliver_at_ms")  # due: a node with a slower clock must not wait
            request = now

        async def local() -> streams_pb2.PublishAck:
            self._admit(request.stream, [request])
            (outcome,) = await self._engine.publish(request.stream, [request])
            if isinstance(outcome, RaftlogError):
                raise outcome
            return ack(request.stream, outcome, primary=self._where.node_id)

        return await self._on_primary(canonical.PUBLISH, request.stream, request, via, local)

    async def publish_batch(self, request: streams_pb2.PublishBatchRequest, via: Call
                            ) -> streams_pb2.PublishBatchResponse:
        subjects.validate_name(request.stream, what="stream")
        check_batch(len(request.entries))
        identity = auth.current()
        # All or nothing: a denied entry stores none. Each subject once, in the entries' order.
        for subject in dict.fromkeys(entry.subject for entry in request.entries):
            identity.require_publish(subject)
        admit_caller(self.quotas, identity, request.entries)

        async def local() -> streams_pb2.PublishBatchResponse:
            self._admit(request.stream, request.entries)
            outcomes = await self._engine.publish(request.stream, request.entries)
            return batch_response([request.stream] * len(outcomes), outcomes,
                                  primary=self._where.node_id)

        return await self._on_primary(canonical.PUBLISH_BATCH, request.stream, request, via,
                                      local)

    async def publish_stream(self, requests: AsyncIterator[streams_pb2.PublishRequest],
                             via: Call) -> streams_pb2.PublishBatchResponse:
        """One result per message in order; messages for streams served elsewhere go there.
        A message the caller may not publish ends the call with PERMISSION_DENIED, one past the
        caller's publish rate with RATE_LIMITED (the messages before it are stored)."""
        requests = _permitted(requests, self.quotas)
        if self._where.forwarder is None:
            return await LocalStream(self._engine, primary=self._where.node_id,
                                     quotas=self.quotas).run(requests)
        return await split_stream(self._engine, self._where, requests, via,
                                  quotas=self.quotas)

    def publish_frames(self, frames: AsyncIterator[streams_pb2.PublishBatchRequest], via: Call
                       ) -> AsyncIterator[streams_pb2.PublishBatchResponse]:
        """Each frame published as a PublishBatch, pipelined; the answers in frame order
        (publish_frames.py)."""
        return FramePipeline(lambda frame: self.publish_batch(frame, via),
                             self._where.primary).run(frames)


async def _permitted(requests: AsyncIterator[streams_pb2.PublishRequest], quotas: QuotaBook
                     ) -> AsyncIterator[streams_pb2.PublishRequest]:
    identity = auth.current()  # taken now: the iteration may run in another task
    async for request in requests:
        identity.require_publish(request.subject)
        admit_caller(quotas, identity, [request])
        yield request
