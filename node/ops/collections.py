"""Collections over streams: hashes, sets and queues (raftlog.v1 Collections), built only on the
stream and consumer operations, so a standalone node and a cluster serve them alike and every
call reaches the collection stream's primary (forwarded when it lives elsewhere) and survives
its failover. docs/collections.md says what each call promises.

- `collection_layout` how a collection sits on its stream (pure).
- `collection_base`   the stream calls, errors, listing and retries every kind shares.
- `collection_keyed`  hashes and sets.
- `collection_queue`  queues.
- here                the lifecycle: a collection is created as its stream (plus, for a queue,
                      the pop consumer) with its settings as the stream's description, and
                      deleted with it.
"""

from __future__ import annotations

import asyncio

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collection_base import on
from raftlog.node.ops.collection_keyed import KeyedOps
from raftlog.node.ops.collection_layout import Target
from raftlog.node.ops.collection_queue import QueueOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import streams_pb2, types_pb2


class CollectionOps(KeyedOps, QueueOps):
    """Every Collections call: the lifecycle here, hashes and sets in `KeyedOps`, queues in
    `QueueOps`."""

    # -------------------------------------------------------------------------- lifecycle

    async def create(self, request: pb.CreateCollectionRequest, via: Call) -> pb.CollectionInfo:
        settings = layout.settings_from_request(request)
        collection = layout.target(request.kind, request.name)
        try:
            stream = await self._streams.create(streams_pb2.CreateStreamRequest(
                config=layout.stream_config(collection, settings)), via)
        except RaftlogError as err:
            if err.reason is not Reason.STREAM_EXISTS:
                raise
            raise RaftlogError(Reason.COLLECTION_EXISTS,
                               f"{collection.word} {collection.name!r} exists (its stream "
                               f"{collection.stream!r} does)", kind=collection.word,
                               collection=collection.name) from None
        stream = await self._ready(collection, stream, via)
        if collection.kind == layout.QUEUE:
            await self._create_pop_consumer(collection, via)
        return layout.info(collection, settings, stream)

    async def _ready(self, collection: Target, created: types_pb2.StreamInfo, via: Call
                     ) -> types_pb2.StreamInfo:
        """The new stream's info once its primary serves reads (it holds its first lease from
        a majority of the replicas), so the caller's next call finds it ready; after
        limits.collection_ready_wait_s_max the info it was created with."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.collection_ready_wait_s_max
        while loop.time() < deadline:
            try:
                return await self._streams.info(
                    streams_pb2.GetStreamInfoRequest(name=collection.stream), via)
            except RaftlogError as err:
                if err.status_name != "UNAVAILABLE":
                    raise
            await asyncio.sleep(limits.collection_ready_poll_ms / 1000)
        return created

    async def delete(self, request: pb.DeleteCollectionRequest, via: Call
                     ) -> pb.DeleteCollectionResponse:
        collection = layout.target(request.kind, request.name)
        await self._stream_info(collection, via)  # only a collection's stream is deleted
        await on(collection, self._streams.delete(
            streams_pb2.DeleteStreamRequest(name=collection.stream), via))
        return pb.DeleteCollectionResponse()

    async def info(self, request: pb.GetCollectionInfoRequest, via: Call) -> pb.CollectionInfo:
        collection = layout.target(request.kind, request.name)
        settings, stream = await self._stream_info(collection, via)
        return layout.info(collection, settings, stream)

    async def list_collections(self, request: pb.ListCollectionsRequest, via: Call
                               ) -> pb.ListCollectionsResponse:
        kind = request.kind
        prefix = layout.STREAM_PREFIX[layout.check_kind(kind)] if kind else ""
        reply = await self._streams.list(streams_pb2.ListStreamsRequest(prefix=prefix), via)
        found = []
        for stream in reply.streams:
            collection = layout.target_of_stream(stream.config.name)
            if collection is None:
                continue
            settings = layout.settings_of(stream.config.description, kind=collection.kind)
            if settings is not None:
                found.append(layout.info(collection, settings, stream))
        return pb.ListCollectionsResponse(collections=found)
