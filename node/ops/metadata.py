"""The rules for metadata changes (streams and consumers created, changed, deleted) and for
answers that deny existence. `LocalMetadata`: a node on its own changes its engine directly.
In a cluster the metadata goes through Raft first (raft_first.py).
"""

from __future__ import annotations

from typing import Protocol

from raftlog.base.errors import RaftlogError
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2


class Confirms(Protocol):
    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str, via: Call
                      ) -> RaftlogError:
        """What to answer instead of a per-stream call's `error`: a STREAM_NOT_FOUND or
        CONSUMER_NOT_FOUND only once the absence is certain."""
        ...


class StreamMetadata(Confirms, Protocol):
    async def create_stream(self, config: types_pb2.StreamConfig, via: Call
                            ) -> types_pb2.StreamInfo: ...

    async def update_stream(self, request: streams_pb2.UpdateStreamRequest, via: Call
                            ) -> streams_pb2.UpdateStreamResponse: ...

    async def delete_stream(self, name: str, via: Call) -> None: ...

    async def list_streams(self, prefix: str, via: Call) -> list[types_pb2.StreamInfo]: ...


class ConsumerMetadata(Confirms, Protocol):
    async def create_consumer(self, stream: str, config: consumers_pb2.ConsumerConfig, via: Call
                              ) -> consumers_pb2.ConsumerInfo: ...

    async def delete_consumer(self, stream: str, consumer: str, via: Call) -> None: ...


class LocalStreamMetadata:
    """A node on its own: its engine is the metadata of its streams."""

    def __init__(self, engine: StreamEngine) -> None:
        self._engine = engine

    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str, via: Call
                      ) -> RaftlogError:
        return error

    async def create_stream(self, config: types_pb2.StreamConfig, via: Call
                            ) -> types_pb2.StreamInfo:
        return await self._engine.create(config)

    async def update_stream(self, request: streams_pb2.UpdateStreamRequest, via: Call
                            ) -> streams_pb2.UpdateStreamResponse:
        info, pruned = await self._engine.update(request)
        return streams_pb2.UpdateStreamResponse(info=info, pruned=pruned)

    async def delete_stream(self, name: str, via: Call) -> None:
        await self._engine.delete(name)

    async def list_streams(self, prefix: str, via: Call) -> list[types_pb2.StreamInfo]:
        return list(self._engine.infos(prefix))



class LocalConsumerMetadata:
    """A node on its own: its consumer manager is the metadata of its consumers."""

    def __init__(self, manager: ConsumerManager) -> None:
        self._manager = manager

    async def create_consumer(self, stream: str, config: consumers_pb2.ConsumerConfig, via: Call
                              ) -> consumers_pb2.ConsumerInfo:
        return await self._manager.create(stream, config)

    async def delete_consumer(self, stream: str, consumer: str, via: Call) -> None:
        await self._manager.delete(stream, consumer)

    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str, via: Call
                      ) -> RaftlogError:
        return error
