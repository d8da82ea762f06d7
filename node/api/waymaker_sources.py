"""Stream sources on the Waymaker API: the conversions of a source's config and status between
waymaker.streams and raftlog.v1 (used by waymaker_convert and waymaker.py), and its
GetStreamSources RPC, served through WaymakerService's `extra` handlers
(`WaymakerSources(ops.streams).handlers()`).

Every field of StreamSourceConfigPb has its raftlog.v1 StreamSource counterpart with the same
meaning (the two OnDropPolicy values map one to one). GetStreamSources answers for the whole
cluster, as raftlog.v1's does: each entry is one tail, reported by the node that runs it (the
sourcing stream's primary), so asking any one node is enough.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api.waymaker_codes import OK
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]

_ON_DROP_IN = {
    wm.ON_DROP_HALT: types_pb2.SOURCE_ON_DROP_HALT,
    wm.ON_DROP_SKIP_TO_FIRST_AVAILABLE: types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE,
}
_ON_DROP_OUT = {raftlog: seed for seed, raftlog in _ON_DROP_IN.items()}


def source_in(source: wm.StreamSourceConfigPb) -> types_pb2.StreamSource:
    """An unknown on_drop value is kept as is: the stream's validation refuses it."""
    transform = source.subject_transform
    return types_pb2.StreamSource(
        stream=source.source_stream, filter_subject=source.filter_subject,
        start_seq=source.start_seq, start_time_ms=source.start_time_ms,
        subject_transform=types_pb2.SubjectTransform(source_pattern=transform.source_pattern,
                                                     destination=transform.destination),
        max_initial_backfill=source.max_initial_backfill,
        on_drop=_ON_DROP_IN.get(source.on_drop, source.on_drop),  # type: ignore[arg-type]
        dlq_stream=source.dlq_stream)


def source_out(source: types_pb2.StreamSource) -> wm.StreamSourceConfigPb:
    transform = source.subject_transform
    return wm.StreamSourceConfigPb(
        source_stream=source.stream, filter_subject=source.filter_subject,
        start_seq=source.start_seq, start_time_ms=source.start_time_ms,
        subject_transform=wm.SubjectTransformPb(source_pattern=transform.source_pattern,
                                                destination=transform.destination),
        max_initial_backfill=source.max_initial_backfill,
        on_drop=_ON_DROP_OUT.get(source.on_drop, wm.ON_DROP_HALT),
        dlq_stream=source.dlq_stream)


def status_out(status: types_pb2.SourceStatus) -> wm.SourceStatusPb:
    return wm.SourceStatusPb(
        source_stream=status.source_stream, last_sourced_seq=status.last_sourced_seq,
        pulled_total=status.pulled_total, last_error=status.last_error,
        last_error_ts_ms=status.last_error_ts_ms)


def entry_out(status: types_pb2.SourceStatus) -> wm.GetStreamSourcesEntry:
    return wm.GetStreamSourcesEntry(
        sourcing_stream=status.sourcing_stream, source_stream=status.source_stream,
        last_sourced_seq=status.last_sourced_seq, pulled_total=status.pulled_total,
        last_error=status.last_error, last_error_ts_ms=status.last_error_ts_ms)


class WaymakerSources:
    def __init__(self, streams: StreamOps) -> None:
        self._streams = streams

    def handlers(self) -> dict[str, Callable[[Any, Context], Awaitable[Any]]]:
        return {"GetStreamSources": self.GetStreamSources}

    @rpc.unary
    async def GetStreamSources(self, request: wm.GetStreamSourcesRequest,
                               context: Context) -> wm.GetStreamSourcesResponse:
        """Always "ok": a member that does not answer in time leaves its tails out."""
        reply = await self._streams.sources(streams_pb2.GetStreamSourcesRequest(),
                                            Call.from_grpc(context))
        return wm.GetStreamSourcesResponse(success=True, result_code=OK,
                                           entries=[entry_out(s) for s in reply.sources])
