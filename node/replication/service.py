"""The replica's side of data replication: the Replication gRPC service.

`Replicate` takes one primary's batches in order; a batch is checked (checksum, epoch, next
seq), applied to the local copy, made durable, and only then acknowledged with the last seq
held. Refusals carry the reason and this node's position, and change nothing stored.
`GetReplicaState` (with a fence epoch) is the failover survey; `ReadLocal` shows the local copy
whatever this node's role; `Repair` mends it for an audit, and `RepairConsumer` removes a
consumer record from the node's own consumer store (unused by a cluster member: see the
method); `Ping` is the liveness probe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from raftlog.base import limits, subjects
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import replication_pb2, replication_pb2_grpc, storage_pb2
from raftlog.node.engine.storage import GroupCommitter
from raftlog.node.engine.stream import ROLE_PRIMARY, Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.transport import logctx, rpc
from raftlog.node.transport.credentials import Credential
from raftlog.node.transport.malformed import MalformedFrameError

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


class ConsumerCopies(Protocol):
    """The node's own consumer store (node/consumers/rocks_store.py on the node's RocksDB),
    as far as `RepairConsumer` uses it."""

    def load(self, stream: str) -> list[storage_pb2.ConsumerRecord]: ...

    async def delete(self, stream: str, name: str) -> None:
        """Durable on return."""
        ...


class ReplicationService(replication_pb2_grpc.ReplicationServicer):
    def __init__(self, *, node_id: str, engine: StreamEngine, committer: GroupCommitter,
                 ensure_replica: Callable[[str], Any],
                 health: Callable[[], replication_pb2.PingReply] | None = None,
                 credential: Credential | None = None,
                 consumer_copies: ConsumerCopies | None = None) -> None:
        """`ensure_replica(stream)` creates the local copy of a stream this node is a replica
        of (per the committed assignment) and returns it, or raises RaftlogError. `health()`
        is what a Ping is answered with; `credential` answers a Ping's challenge.
        `consumer_copies` is the node's own consumer store (None: the node has none, and
        `RepairConsumer` finds nothing to remove)."""
        self._node_id = node_id
        self._consumer_copies = consumer_copies
        self._engine = engine
        self._committer = committer
        self._ensure_replica = ensure_replica
        self._health = health or (lambda: replication_pb2.PingReply(node_id=node_id))
        self._credential = credential
        self.refusals = 0
        # Metrics hooks (node/transport/metrics.py; None: no --metrics): a batch accepted and
        # durable here (messages, bytes of their stored values), a batch refused (reason).
        self.on_applied: Callable[[int, int], None] | None = None
        self.on_refused: Callable[[str], None] | None = None
        # Heartbeat commit notices not yet applied in full: name -> (stream, epoch, commit seq). A
        # notice is applied after the fsync of the batches it came with, and what lies above
        # durable_seq waits here for the batches that make it durable: the primary tells a
        # commit seq once, so a notice capped and then dropped would leave an idle replica's
        # commit seq behind until the next publish.
        self._commit_notices: dict[str, tuple[Stream, int, int]] = {}
        # The open Replicate calls by the primary that sends them (fence notices go there).
        self._calls: dict[str, list[asyncio.Queue[Any]]] = {}

    async def Replicate(self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest],
                        context: Context) -> AsyncIterator[replication_pb2.ReplicateAck]:
        """One primary's Replicate call; see `replicate`."""
        answers = self.replicate(request_iterator)
        try:
            async for ack in answers:
                yield ack
        finally:
            await answers.aclose()

    async def replicate(self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest]
                        ) -> AsyncGenerator[replication_pb2.ReplicateAck, None]:
        """Applies batches in order; the batches waiting together share one fsync (group
        commit), and each is acknowledged, in order, once that fsync is done. Fence notices
        for the sending primary go out on the same call, in order with the answers. The body
        of the Replicate call, also driven directly by the in-memory link
        (node/replication/memory_link.py)."""
        queue: asyncio.Queue[replication_pb2.ReplicateRequest | replication_pb2.ReplicateAck
                             | None] = asyncio.Queue()
        primaries: list[str] = []  # the primary this call comes from, once it said
        # requests read ahead (notices: free)
        slots = asyncio.Semaphore(limits.replicate_requests_waiting_max)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    if not primaries and request.primary:
                        primaries.append(request.primary)
                        self._calls.setdefault(request.primary, []).append(queue)
                    await slots.acquire()
                    queue.put_nowait(request)
            except MalformedFrameError:
                pass  # the call is refused when this generator ends (transport/malformed.py)
            finally:  # the call ends after the last frame, or a frame that did not parse
                queue.put_nowait(None)

        def take() -> replication_pb2.ReplicateRequest | replication_pb2.ReplicateAck | None:
            item = queue.get_nowait()
            if isinstance(item, replication_pb2.ReplicateRequest):
                slots.release()
            return item

        reader = asyncio.get_running_loop().create_task(read())
        try:
            ended = False
            while not ended:
                first = await queue.get()
                if isinstance(first, replication_pb2.ReplicateRequest):
                    slots.release()
                if first is None:
                    return
                if isinstance(first, replication_pb2.ReplicateAck):
                    yield first  # a fence notice, in order with the answers
                    continue
                batch = [first]
                while not queue.empty() and len(batch) < limits.replicate_group_requests_max:
                    following = take()
                    if following is None:
                        ended = True
                        break
                    if isinstance(following, replication_pb2.ReplicateAck):
                        for ack in await self._apply_all(batch):
                            yield ack
                        batch = []
                        yield following
                        continue
                    batch.append(following)
                for ack in await self._apply_all(batch):
                    yield ack
        finally:
            reader.cancel()
            for primary in primaries:
                calls = self._calls.get(primary, [])
                if queue in calls:
                    calls.remove(queue)
                if not calls:
                    self._calls.pop(primary, None)

    def _notify_fenced(self, stream: Stream, fence_epoch: int) -> None:
        """Tells the primary that sends this stream (on its Replicate calls) that a survey
        fenced it above its epoch: it steps down before any later answer reaches it."""
        for queue in self._calls.get(stream.replicated_by, []):
            queue.put_nowait(replication_pb2.ReplicateAck(
                stream=stream.name, epoch=stream.record.epoch, refused=Reason.STALE_EPOCH.name,
                message=f"{stream.name!r} was fenced at epoch {fence_epoch} on "
                f"{self._node_id}", replica_epoch=fence_epoch,
                last_seq=stream.record.last_seq))

    async def apply(self, request: replication_pb2.ReplicateRequest
                    ) -> replication_pb2.ReplicateAck:
        (ack,) = await self._apply_all([request])
        return ack

    async def _apply_all(self, requests: list[replication_pb2.ReplicateRequest]
                         ) -> list[replication_pb2.ReplicateAck]:
        if not requests:
            return []
        accepted = [await self._accept(request) if request.stream else self._heartbeat(request)
                    for request in requests]
        if any(wrote for _, _, wrote in accepted):
            await self._committer.durable()
        for request, (ack, stream, _) in zip(requests, accepted, strict=True):
            if stream is not None and not ack.refused:
                stream.durable_seq = max(stream.durable_seq, ack.last_seq)
                stream.set_commit_seq(request.commit_seq)
                if self.on_applied is not None:
                    self.on_applied(len(request.messages), sum(map(len, request.messages)))
        if self._commit_notices:
            self._apply_commit_notices()
        return [ack for ack, _, _ in accepted]

    def _heartbeat(self, request: replication_pb2.ReplicateRequest
                   ) -> tuple[replication_pb2.ReplicateAck, Stream | None, bool]:
        """A link heartbeat: keep its commit notices (applied once the batches grouped with
        it are durable, `_apply_commit_notices`); its ack keeps the primary's lease."""
        for notice in request.commits[:limits.heartbeat_commits_applied_max]:
            stream = self._engine.streams.get(notice.stream)
            if stream is None:
                continue
            kept = self._commit_notices.get(notice.stream)
            if kept is None or kept[0] is not stream or kept[1] != notice.epoch \
                    or kept[2] < notice.commit_seq:
                self._commit_notices[notice.stream] = (stream, notice.epoch, notice.commit_seq)
        return replication_pb2.ReplicateAck(request_id=request.request_id), None, False

    def _apply_commit_notices(self) -> None:
        """Moves each noticed stream's commit seq up to its notice, never above what is
        durable here; a notice stays until durable_seq reaches it (the batches that hold
        its seqs may come after it), or until it no longer applies (the stream is gone or
        was replaced, moved to another epoch or was fenced above it)."""
        for name, (stream, epoch, commit_seq) in list(self._commit_notices.items()):
            if self._engine.streams.get(name) is not stream or epoch != stream.record.epoch \
                    or epoch < stream.record.fenced_epoch:
                del self._commit_notices[name]
                continue
            stream.set_commit_seq(min(commit_seq, stream.durable_seq))
            if stream.durable_seq >= commit_seq:
                del self._commit_notices[name]

    async def _accept(self, request: replication_pb2.ReplicateRequest
                      ) -> tuple[replication_pb2.ReplicateAck, Stream | None, bool]:
        """Checks and writes one batch (not yet durable): (ack, local stream, wrote)."""
        ack = replication_pb2.ReplicateAck(stream=request.stream, epoch=request.epoch,
                                           request_id=request.request_id)
        stream: Stream | None = None
        try:
            stream = await self._local(request.stream)
            last_seq = stream.accept_replicated(request)
            stream.replicated_by = request.primary
            ack.last_seq = last_seq
            ack.replica_epoch = stream.record.epoch
            return ack, stream, bool(request.messages or request.removed or request.reseed)
        except RaftlogError as err:
            self.refusals += 1
            if self.on_refused is not None:
                self.on_refused(err.reason.name)
            if err.reason not in (Reason.SEQ_GAP,):
                log.warning("refused a batch of %s from %s (epoch %d, seq %d): %s %s",
                            request.stream, request.primary, request.epoch, request.first_seq,
                            err.reason.name, err.message,
                            extra=logctx.fields(stream=request.stream, epoch=request.epoch))
            ack.refused = err.reason.name
            ack.message = err.message
            ack.last_seq = int(err.metadata.get("last_seq", stream.last_seq if stream else 0))
            ack.replica_epoch = int(err.metadata.get("replica_epoch", 0))
            return ack, stream, False

    async def _local(self, name: str) -> Stream:
        stream = self._engine.streams.get(name)
        if stream is None:
            stream = await self._ensure_replica(name)
        if stream is None:
            raise InvariantViolation(f"no local copy of {name!r} after creating one")
        return stream

    def _state(self, name: str) -> replication_pb2.ReplicaState:
        stream = self._engine.streams.get(name)
        if stream is None:
            return replication_pb2.ReplicaState(stream=name, node_id=self._node_id)
        epoch, first_seq, last_seq, commit_seq = stream.replica_state()
        return replication_pb2.ReplicaState(
            stream=name, node_id=self._node_id, exists=True, epoch=epoch, first_seq=first_seq,
            last_seq=last_seq, commit_seq=commit_seq, fenced_epoch=stream.record.fenced_epoch,
            last_epoch=stream.record.last_epoch,
            serving=stream.role == ROLE_PRIMARY and stream.deposed is None)

    def _fence_now(self, name: str, fence_epoch: int) -> Stream | None:
        """Refuses batches below `fence_epoch` from now on (durable once the caller awaited
        the group commit); a primary below that epoch stops taking writes. STALE_EPOCH when
        this node already leads at or above it."""
        stream = self._engine.streams.get(name)
        if stream is None or not fence_epoch:
            return None
        if stream.role == ROLE_PRIMARY and stream.deposed is None:
            if stream.record.epoch >= fence_epoch:
                raise RaftlogError(Reason.STALE_EPOCH, "this node already leads that epoch",
                                   stream=name, epoch=stream.record.epoch)
            # A failover or a planned handover: take no more writes; replication of what is
            # stored carries on so that the successor can catch up.
            stream.depose(RaftlogError(
                Reason.NOT_PRIMARY, f"{name!r} is moving to another node; retry with the "
                "same msg_id", stream=name))
        if stream.fence_unsynced(fence_epoch) and stream.role != ROLE_PRIMARY:
            self._notify_fenced(stream, fence_epoch)
        return stream

    @rpc.unary
    async def GetReplicaState(self, request: replication_pb2.GetReplicaStateRequest,
                              context: Context) -> replication_pb2.ReplicaState:
        if self._fence_now(request.stream, request.fence_epoch) is not None:
            await self._committer.durable()
        return self._state(request.stream)

    @rpc.unary
    async def Survey(self, request: replication_pb2.SurveyRequest,
                     context: Context) -> replication_pb2.SurveyReply:
        """Many GetReplicaState calls in one: all fences share one fsync, then every state."""
        if len(request.streams) > limits.survey_streams_max:
            raise RaftlogError(Reason.BATCH_TOO_LARGE, f"a survey names at most "
                               f"{limits.survey_streams_max} streams",
                               limit=limits.survey_streams_max)
        refused: dict[int, RaftlogError] = {}
        fenced = False
        for index, item in enumerate(request.streams):
            try:
                fenced = self._fence_now(item.stream, item.fence_epoch) is not None or fenced
            except RaftlogError as err:
                refused[index] = err
        if fenced:
            await self._committer.durable()
        reply = replication_pb2.SurveyReply()
        for index, item in enumerate(request.streams):
            state = self._state(item.stream)
            if index in refused:  # leads at or above the fence: report, do not fence
                state.serving = True
            reply.states.append(state)
        return reply

    @rpc.unary
    async def ReadLocal(self, request: replication_pb2.ReadLocalRequest,
                        context: Context) -> replication_pb2.ReadLocalResponse:
        limit = min(request.limit or limits.read_local_limit_max, limits.read_local_limit_max)
        stream = self._engine.streams.get(request.stream)
        reply = replication_pb2.ReadLocalResponse(state=self._state(request.stream))
        if stream is None:
            return reply
        first = max(request.from_seq, stream.first_seq)
        values = stream.stored_values(from_seq=first,
                                      to_seq=min(stream.last_seq, first + limit - 1),
                                      bytes_max=limits.read_local_bytes_max)
        reply.messages.extend(replication_pb2.LocalMessage(seq=first + i, stored=value)
                              for i, value in enumerate(values) if value)
        return reply

    @rpc.unary
    async def Repair(self, request: replication_pb2.RepairRequest,
                     context: Context) -> replication_pb2.RepairReply:
        """One step of an audit's repair plan on the local copy (node/engine/stream_repair.py);
        durable before the answer."""
        stream = self._engine.streams.get(request.stream)
        if stream is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"this node holds no copy of "
                               f"{request.stream!r}", stream=request.stream)
        stream.check_repairable(
            expect_last_seq=request.expect_last_seq if request.HasField("expect_last_seq")
            else None,
            expect_epoch=request.expect_epoch if request.HasField("expect_epoch") else None)
        action = request.WhichOneof("action")
        if action == "truncate_after":
            changed = stream.repair_truncate(request.truncate_after)
        elif action == "put":
            if len(request.put.messages) > limits.read_local_limit_max:
                raise RaftlogError(Reason.BATCH_TOO_LARGE, f"a repair stores at most "
                                   f"{limits.read_local_limit_max} messages per call",
                                   limit=limits.read_local_limit_max)
            changed = stream.repair_put([(m.seq, m.stored) for m in request.put.messages])
        elif action == "reset_to":
            changed = stream.repair_reset(request.reset_to)
        else:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a repair names one action: "
                               "truncate_after, put or reset_to")
        await self._committer.durable()
        return replication_pb2.RepairReply(state=self._state(request.stream), changed=changed)

    @rpc.unary
    async def RepairConsumer(self, request: replication_pb2.RepairConsumerRequest,
                             context: Context) -> replication_pb2.RepairConsumerReply:
        """The consumer step of an audit's repair plan on this node's own consumer store
        (holder "store" in an export); durable before the answer.

        A cluster member keeps consumer state in the metadata group only (consumers/
        raft_store.py): the stream's primary serves every consumer from there, and nothing
        reads or updates a record in the node's own store. A record found there is therefore
        removed rather than rewritten: a rewritten copy would drift from the metadata with the
        next ack. Refused (CONSUMER_CHANGED) when the record is not what the plan saw; a
        consumer the store holds no record of is already repaired (changed 0)."""
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_name(request.consumer, what="consumer")
        if request.stream not in self._engine.streams:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"this node holds no copy of "
                               f"{request.stream!r}", stream=request.stream)
        if self._consumer_copies is None:
            return replication_pb2.RepairConsumerReply(changed=0)
        record = next((r for r in self._consumer_copies.load(request.stream)
                       if r.config.name == request.consumer), None)
        if record is None:
            return replication_pb2.RepairConsumerReply(changed=0)
        if request.HasField("expect"):
            expect = request.expect
            seen = (expect.delivered_seq, expect.ack_floor, expect.acked_count)
            now = (record.delivered_seq, record.ack_floor, len(record.acked))
            if seen != now:
                raise RaftlogError(
                    Reason.CONSUMER_CHANGED, f"this node's store holds consumer "
                    f"{request.consumer!r} of {request.stream!r} at delivered seq {now[0]}, "
                    f"ack floor {now[1]} with {now[2]} acked; the plan saw {seen[0]}, "
                    f"{seen[1]}, {seen[2]}: audit again", stream=request.stream,
                    consumer=request.consumer)
        await self._consumer_copies.delete(request.stream, request.consumer)
        return replication_pb2.RepairConsumerReply(changed=1)

    async def Ping(self, request: replication_pb2.PingRequest,
                   context: Context) -> replication_pb2.PingReply:
        reply = self._health()
        if request.nonce and self._credential is not None:
            reply.proof = self._credential.prove(request.nonce[:limits.ping_nonce_bytes_max],
                                                 principal=self._node_id)
        return reply
