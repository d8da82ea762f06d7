"""The replica's side of data replication: the Replication gRPC service.

`Replicate` takes one primary's batches in order; a batch is checked (checksum, epoch, next
seq), applied to the local copy, made durable, and only then acknowledged with the last seq
held. Refusals carry the reason and this node's position, and change nothing stored.
`GetReplicaState` (with a fence epoch) is the failover survey; `ReadLocal` shows the local copy
whatever this node's role; `Ping` is the liveness probe.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from raftlog.node import rpc
from raftlog.node.errors import RaftlogError, Reason
from raftlog.node.storage import GroupCommitter
from raftlog.node.stream import ROLE_PRIMARY, Stream
from raftlog.node.streams import StreamEngine
from raftlog.v1 import replication_pb2, replication_pb2_grpc

log = logging.getLogger(__name__)

read_local_limit_max = 10_000
group_requests_max = 64  # batches of one call that share an fsync
requests_waiting_max = 256  # batches read ahead of the one being applied
Context = grpc.aio.ServicerContext[Any, Any]


class ReplicationService(replication_pb2_grpc.ReplicationServicer):
    def __init__(self, *, node_id: str, engine: StreamEngine, committer: GroupCommitter,
                 ensure_replica: Callable[[str], Any]) -> None:
        """`ensure_replica(stream)` creates the local copy of a stream this node is a replica
        of (per the committed assignment) and returns it, or raises RaftlogError."""
        self._node_id = node_id
        self._engine = engine
        self._committer = committer
        self._ensure_replica = ensure_replica
        self.refusals = 0

    async def Replicate(self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest],
                        context: Context) -> AsyncIterator[replication_pb2.ReplicateAck]:
        """Applies batches in order; the batches waiting together share one fsync (group
        commit), and each is acknowledged, in order, once that fsync is done."""
        queue: asyncio.Queue[replication_pb2.ReplicateRequest | None] = asyncio.Queue(
            requests_waiting_max)

        async def read() -> None:
            async for request in request_iterator:
                await queue.put(request)
            await queue.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            ended = False
            while not ended:
                first = await queue.get()
                if first is None:
                    return
                batch = [first]
                while not queue.empty() and len(batch) < group_requests_max:
                    following = queue.get_nowait()
                    if following is None:
                        ended = True
                        break
                    batch.append(following)
                for ack in await self._apply_all(batch):
                    yield ack
        finally:
            reader.cancel()

    async def apply(self, request: replication_pb2.ReplicateRequest
                    ) -> replication_pb2.ReplicateAck:
        (ack,) = await self._apply_all([request])
        return ack

    async def _apply_all(self, requests: list[replication_pb2.ReplicateRequest]
                         ) -> list[replication_pb2.ReplicateAck]:
        accepted = [await self._accept(request) for request in requests]
        if any(wrote for _, _, wrote in accepted):
            await self._committer.durable()
        for request, (ack, stream, _) in zip(requests, accepted, strict=True):
            if stream is not None and not ack.refused:
                stream.durable_seq = max(stream.durable_seq, ack.last_seq)
                stream.set_commit_seq(request.commit_seq)
        return [ack for ack, _, _ in accepted]

    async def _accept(self, request: replication_pb2.ReplicateRequest
                      ) -> tuple[replication_pb2.ReplicateAck, Stream | None, bool]:
        """Checks and writes one batch (not yet durable): (ack, local stream, wrote)."""
        ack = replication_pb2.ReplicateAck(stream=request.stream, epoch=request.epoch,
                                           request_id=request.request_id)
        stream: Stream | None = None
        try:
            stream = await self._local(request.stream)
            self._check_checksum(request)
            last_seq = stream.accept_replicated(
                epoch=request.epoch,
                history=[(e.fence_epoch, e.start_seq) for e in request.history],
                first_seq=request.first_seq, values=list(request.messages),
                removed=[(r.first, r.last) for r in request.removed],
                reseed=request.reseed, head_seq=request.head_seq)
            ack.last_seq = last_seq
            ack.replica_epoch = stream.record.epoch
            return ack, stream, bool(request.messages or request.removed or request.reseed)
        except RaftlogError as err:
            self.refusals += 1
            if err.reason not in (Reason.SEQ_GAP,):
                log.warning("refused a batch of %s from %s (epoch %d, seq %d): %s %s",
                            request.stream, request.primary, request.epoch, request.first_seq,
                            err.reason.name, err.message)
            ack.refused = err.reason.name
            ack.message = err.message
            ack.last_seq = int(err.metadata.get("last_seq", stream.last_seq if stream else 0))
            ack.replica_epoch = int(err.metadata.get("replica_epoch", 0))
            return ack, stream, False

    async def _local(self, name: str) -> Stream:
        stream = self._engine.streams.get(name)
        if stream is None:
            stream = await self._ensure_replica(name)
        assert stream is not None
        return stream

    @staticmethod
    def _check_checksum(request: replication_pb2.ReplicateRequest) -> None:
        if request.messages and zlib.crc32(b"".join(request.messages)) != request.checksum:
            raise RaftlogError(Reason.CORRUPT_RECORD, "the batch does not match its checksum",
                               first_seq=request.first_seq)

    def _state(self, name: str) -> replication_pb2.ReplicaState:
        stream = self._engine.streams.get(name)
        if stream is None:
            return replication_pb2.ReplicaState(stream=name, node_id=self._node_id)
        epoch, first_seq, last_seq, commit_seq = stream.replica_state()
        return replication_pb2.ReplicaState(
            stream=name, node_id=self._node_id, exists=True, epoch=epoch, first_seq=first_seq,
            last_seq=last_seq, commit_seq=commit_seq)

    @rpc.unary
    async def GetReplicaState(self, request: replication_pb2.GetReplicaStateRequest,
                              context: Context) -> replication_pb2.ReplicaState:
        stream = self._engine.streams.get(request.stream)
        if stream is not None and request.fence_epoch:
            if stream.role == ROLE_PRIMARY and stream.deposed is None:
                if stream.record.epoch >= request.fence_epoch:
                    raise RaftlogError(Reason.STALE_EPOCH, "this node already leads that epoch")
                # A planned handover: take no more writes; replication of what is stored
                # carries on so that the successor can catch up.
                stream.depose(RaftlogError(
                    Reason.NOT_PRIMARY, f"{request.stream!r} is moving to another node; "
                    "retry with the same msg_id", stream=request.stream))
            await stream.fence(request.fence_epoch)
        return self._state(request.stream)

    @rpc.unary
    async def ReadLocal(self, request: replication_pb2.ReadLocalRequest,
                        context: Context) -> replication_pb2.ReadLocalResponse:
        limit = min(request.limit or read_local_limit_max, read_local_limit_max)
        stream = self._engine.streams.get(request.stream)
        reply = replication_pb2.ReadLocalResponse(state=self._state(request.stream))
        if stream is None:
            return reply
        first = max(request.from_seq, stream.first_seq)
        values = stream.stored_values(from_seq=first,
                                      to_seq=min(stream.last_seq, first + limit - 1),
                                      bytes_max=64 * 1024 * 1024)
        reply.messages.extend(replication_pb2.LocalMessage(seq=first + i, stored=value)
                              for i, value in enumerate(values) if value)
        return reply

    async def Ping(self, request: replication_pb2.PingRequest,
                   context: Context) -> replication_pb2.PingReply:
        return replication_pb2.PingReply(node_id=self._node_id)
