"""Numaflow's user-defined source (`source.v1.Source`, protos/raftlog/compat/numaflow_source.proto)
served by a sidecar on a Unix socket, reading one raftlog stream, or the partitions of a topic,
through a durable consumer.

numa, Numaflow's data plane, dials the socket once the server-info file exists and drives the
service; this process is a raftlog *client* (`Backend`): every call goes over gRPC to one of the
given nodes, which forwards it to the stream's primary, and moves to the next node when the one
it talks to stops answering. Nothing is kept here that a restart would lose: delivery state is
the consumer's, acks are the cluster's (Raft-committed), so the semantics are at-least-once.

- `SourceConfig.streams` maps each watermark partition this sidecar serves to the stream read
  for it: one entry for `--stream`, the replica's share of the topic's partitions for `--topic`
  (`topic_config`). A partition's stream has a consumer of the same name (a topic group).
- `Offset` bytes are `raftlog:<stream>:<seq>` (`encode_offset` / `decode_offset`): an ack maps
  straight back to a raftlog ack of that stream's seq; `partition_id` is the stream's partition.
- `SourceServicer` implements the six calls; `serve` runs it (server-info file written only
  once the socket listens, removed on exit). docs/numaflow.md has the full contract.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import empty_pb2, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.base import limits
from raftlog.compat import numaflow_source_pb2 as pb
from raftlog.compat import numaflow_source_pb2_grpc as pb_grpc
from raftlog.node.cli import bearer
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    consumers_pb2,
    consumers_pb2_grpc,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)

log = logging.getLogger("raftlog.numaflow")

OFFSET_PREFIX = b"raftlog:"
# What pynumaflow writes after the JSON of the server-info file; numa reads up to it.
SERVER_INFO_END = "U+005C__END__"
# Errors worth trying again (elsewhere): the node is gone, busy or between primaries.
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", limits.numaflow_message_bytes_max),
    ("grpc.max_send_message_length", limits.numaflow_message_bytes_max),
]
T = TypeVar("T")


class BadOffset(ValueError):
    """Offset bytes this source did not hand out."""


def encode_offset(*, stream: str, seq: int) -> bytes:
    return OFFSET_PREFIX + f"{stream}:{seq}".encode()


def decode_offset(data: bytes) -> tuple[str, int]:
    """(stream, seq) of offset bytes made by `encode_offset`; BadOffset otherwise."""
    if not data.startswith(OFFSET_PREFIX):
        raise BadOffset(f"offset {data[:64]!r} was not handed out by this source "
                        f"(it starts with {OFFSET_PREFIX.decode()!r})")
    stream, sep, seq = data[len(OFFSET_PREFIX):].decode(errors="replace").rpartition(":")
    if not sep or not stream or not seq.isdigit() or int(seq) == 0:
        raise BadOffset(f"offset {data[:64]!r} is malformed (expected raftlog:STREAM:SEQ)")
    return stream, int(seq)


def server_info_text(fields: dict[str, Any]) -> str:
    return json.dumps(fields) + SERVER_INFO_END


class BackendDown(Exception):
    """No node of the cluster answered within the retry budget."""


@dataclass(frozen=True)
class _Stubs:
    channel: grpc.aio.Channel
    consumers: Any
    topics: Any
    health: Any


class Backend:
    """Calls to a raftlog cluster through any of `addresses`, moving on when one fails.

    One channel per address, opened on first use and kept (closing one would cancel the calls
    still running on it). Concurrent calls share the current address; when several fail on it
    together, only the first moves on (`_moves` tells the others it already happened)."""

    def __init__(self, addresses: Sequence[str], *, token: str | None = None,
                 tls: grpc.ChannelCredentials | None = None) -> None:
        """`token`: a user's bearer token, sent on every call (docs/auth.md); `tls`: connect
        over TLS with these credentials (docs/tls.md), plaintext without."""
        if not addresses:
            raise ValueError("a backend needs at least one address")
        self.addresses = list(addresses)
        self._token = token
        self._tls = tls
        self._at = 0
        self._moves = 0
        self._stubs: dict[int, _Stubs] = {}

    def _current(self) -> _Stubs:
        if self._at not in self._stubs:
            address, interceptors = self.addresses[self._at], bearer.interceptors(self._token)
            channel = (grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS,
                                                 interceptors=interceptors)
                       if self._tls is None else
                       grpc.aio.secure_channel(address, self._tls, options=_CHANNEL_OPTIONS,
                                               interceptors=interceptors))
            self._stubs[self._at] = _Stubs(
                channel=channel,
                consumers=consumers_pb2_grpc.ConsumersStub(channel),  # type: ignore[no-untyped-call]
                topics=topics_pb2_grpc.TopicsStub(channel),  # type: ignore[no-untyped-call]
                health=health_pb2_grpc.HealthStub(channel))
        return self._stubs[self._at]

    @property
    def consumers(self) -> Any:
        """The Consumers stub of the current address (look it up per attempt)."""
        return self._current().consumers

    @property
    def topics(self) -> Any:
        """The Topics stub of the current address (look it up per attempt)."""
        return self._current().topics

    @property
    def address(self) -> str:
        return self.addresses[self._at]

    def _move_on(self, *, seen_moves: int) -> None:
        if seen_moves == self._moves:
            self._at = (self._at + 1) % len(self.addresses)
            self._moves += 1

    async def call(self, what: str, attempt: Callable[[], Awaitable[T]], *,
                   budget_s: float = limits.numaflow_call_retry_ms_max / 1000) -> T:
        """Runs `attempt` until it succeeds or fails for a reason retrying cannot mend
        (raised as is); retryable failures move to the next node. BackendDown when the budget
        is spent."""
        deadline = time.monotonic() + budget_s
        while True:
            moves = self._moves
            try:
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRYABLE:
                    raise
                if time.monotonic() >= deadline:
                    raise BackendDown(f"{what}: no node answered within {budget_s:g} s "
                                      f"(last: {self.address}: {exc.code().name} "
                                      f"{exc.details()})") from None
                log.info("%s via %s failed (%s); trying the next node", what, self.address,
                         exc.code().name)
                self._move_on(seen_moves=moves)
                await asyncio.sleep(limits.numaflow_retry_pause_ms / 1000)

    async def is_serving(self) -> bool:
        """Whether some node answers its health check (tries each once)."""
        for _ in self.addresses:
            moves = self._moves
            try:
                answer = await self._current().health.Check(
                    health_pb2.HealthCheckRequest(),
                    timeout=limits.numaflow_ready_check_ms / 1000)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.aio.AioRpcError:
                pass
            self._move_on(seen_moves=moves)
        return False

    async def close(self) -> None:
        for stubs in self._stubs.values():
            await stubs.channel.close(None)
        self._stubs.clear()


@dataclass(frozen=True)
class SourceConfig:
    """What one sidecar serves. `streams` maps each watermark partition it reports to the stream
    read for it (in partition order); every stream has a consumer named `consumer`."""

    streams: dict[int, str]
    consumer: str
    nack_delay_ms: int = 0
    topic: str | None = None
    total_partitions: int | None = None  # the topic's count; unset (unknown) for one stream

    @classmethod
    def for_stream(cls, *, stream: str, consumer: str, partition: int,
                   nack_delay_ms: int = 0) -> SourceConfig:
        return cls(streams={partition: stream}, consumer=consumer, nack_delay_ms=nack_delay_ms)

    @property
    def reads(self) -> str:
        """What the sidecar reads, for messages: `S/C` or `topic T (partitions 0, 2)/C`."""
        if self.topic is None:
            return f"{next(iter(self.streams.values()))}/{self.consumer}"
        served = ", ".join(str(p) for p in self.streams)
        return f"topic {self.topic} (partitions {served})/{self.consumer}"


def assigned_partitions(count: int, *, replica: int, replicas: int) -> list[int]:
    """The partitions of a `count`-partition topic that replica `replica` of `replicas` serves:
    partition p goes to replica p % replicas."""
    if not 0 <= replica < replicas:
        raise ValueError(f"replica {replica} is not in 0..{replicas - 1}")
    return [p for p in range(count) if p % replicas == replica]


def fair_shares(quota: int, ways: int) -> list[int]:
    """`quota` split over `ways` takers as evenly as possible, the larger shares first."""
    base, extra = divmod(quota, ways)
    return [base + (1 if i < extra else 0) for i in range(ways)]


class SourceServicer(pb_grpc.SourceServicer):
    """The six calls of `source.v1.Source` over the consumers of `config.streams`."""

    def __init__(self, backend: Backend, config: SourceConfig) -> None:
        self.backend = backend
        self.config = config
        self._partition_of = {stream: p for p, stream in config.streams.items()}
        self._order = list(config.streams.items())
        self._turn = 0  # where the next read starts in `_order` (round-robin)

    # ------------------------------------------------------------------ reads

    async def ReadFn(self, request_iterator: AsyncIterator[pb.ReadRequest],
                     context: grpc.aio.ServicerContext[Any, Any]
                     ) -> AsyncIterator[pb.ReadResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        if not (first.HasField("handshake") and first.handshake.sot):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "ReadFn: the first ReadRequest must be the handshake "
                                "{handshake: {sot: true}}")
        yield pb.ReadResponse(handshake=pb.Handshake(sot=True), status=pb.ReadResponse.Status(
            eot=False, code=pb.ReadResponse.Status.SUCCESS))
        async for read in requests:
            if read.HasField("handshake") or read.request.num_records == 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "ReadFn: after the handshake every ReadRequest needs "
                                    "request.num_records > 0 (and no second handshake)")
            try:
                results = await self._read(read.request.num_records, read.request.timeout_in_ms)
            except _StreamFailed as failed:  # e.g. the consumer was deleted meanwhile
                await context.abort(failed.error.code(),
                                    self._node_error("Fetch", failed.stream, failed.error))
            for result in results:
                yield pb.ReadResponse(result=result, status=pb.ReadResponse.Status(eot=False))
            yield pb.ReadResponse(status=pb.ReadResponse.Status(
                eot=True, code=pb.ReadResponse.Status.SUCCESS))

    def _rotation(self) -> list[tuple[int, str]]:
        """The served (partition, stream) pairs, starting one further on at every read."""
        at = self._turn % len(self._order)
        self._turn += 1
        return self._order[at:] + self._order[:at]

    async def _read(self, num_records: int, timeout_ms: int) -> list[pb.ReadResponse.Result]:
        """Up to num_records results within timeout_ms, taken round-robin from the served
        streams; nothing (not an error) when the cluster cannot be reached in time: numa simply
        asks again.

        Each round fetches from several streams at once, each at most its fair share of what is
        still wanted (so a round never hands out more than numa asked for). A round that finds
        nothing waits: on one stream for the whole timeout, on several for a poll slice at a
        time (a Fetch returns at its first message, but the round waits for all of them). After
        a round that found something, only the streams that filled their share are asked again,
        without waiting."""
        deadline = time.monotonic() + timeout_ms / 1000
        wanted = min(num_records, limits.fetch_batch_max)
        order = self._rotation()
        results: list[pb.ReadResponse.Result] = []
        asking, wait = order, len(order) == 1
        while wanted > 0 and asking:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            wait_ms = 0 if not wait else (
                left_ms if len(asking) == 1 else min(left_ms, limits.numaflow_poll_slice_ms))
            shares = [(pair, share) for pair, share in
                      zip(asking, fair_shares(wanted, len(asking)), strict=True) if share > 0]
            batches = await asyncio.gather(*(
                self._fetch(stream, batch=share, wait_ms=wait_ms, deadline=deadline)
                for (_, stream), share in shares))
            for ((partition, _), _), batch in zip(shares, batches, strict=True):
                results += [self._result(message, partition) for message in batch]
            found = sum(len(batch) for batch in batches)
            wanted -= found
            if found:
                asking = [pair for (pair, share), batch in zip(shares, batches, strict=True)
                          if len(batch) == share]
                wait = False
            elif results or time.monotonic() >= deadline:
                break
            else:
                asking, wait = order, True
        return results

    async def _fetch(self, stream: str, *, batch: int, wait_ms: int,
                     deadline: float) -> list[types_pb2.Message]:
        """One Fetch of up to `batch` from `stream`, retried on other nodes until `deadline`;
        [] when no node answered by then. _StreamFailed when the node refuses it."""
        request = consumers_pb2.FetchRequest(stream=stream, consumer=self.config.consumer,
                                             batch=batch)

        async def fetch() -> consumers_pb2.FetchResponse:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            request.max_wait_ms = min(wait_ms, left_ms, limits.fetch_wait_ms_max)
            answer: consumers_pb2.FetchResponse = await self.backend.consumers.Fetch(
                request, timeout=request.max_wait_ms / 1000 + limits.numaflow_call_slack_ms / 1000)
            return answer

        try:
            budget_s = max(0.0, deadline - time.monotonic())
            answer = await self.backend.call(f"Fetch from {stream}", fetch, budget_s=budget_s)
        except BackendDown as exc:
            log.warning("read: %s", exc)
            return []
        except grpc.aio.AioRpcError as exc:
            raise _StreamFailed(stream, exc) from None
        return list(answer.messages)

    def _result(self, message: types_pb2.Message, partition: int) -> pb.ReadResponse.Result:
        event_time = timestamp_pb2.Timestamp()
        event_time.FromMilliseconds(message.ts_ms)
        stream = message.stream or self.config.streams[partition]
        return pb.ReadResponse.Result(
            payload=message.payload,
            offset=pb.Offset(offset=encode_offset(stream=stream, seq=message.seq),
                             partition_id=partition),
            event_time=event_time,
            keys=[message.subject],
            headers={h.key: h.value for h in message.headers})

    # ------------------------------------------------------------------ acks

    async def AckFn(self, request_iterator: AsyncIterator[pb.AckRequest],
                    context: grpc.aio.ServicerContext[Any, Any]
                    ) -> AsyncIterator[pb.AckResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        if not (first.HasField("handshake") and first.handshake.sot):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "AckFn: the first AckRequest must be the handshake "
                                "{handshake: {sot: true}}")
        success = pb.AckResponse.Result(success=empty_pb2.Empty())
        yield pb.AckResponse(handshake=pb.Handshake(sot=True), result=success)
        async for ack in requests:
            seqs = await self._seqs(ack.request.offsets, context, what="AckFn")
            await self._settle("Ack", seqs, context)
            yield pb.AckResponse(result=success)

    async def NackFn(self, request: pb.NackRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> pb.NackResponse:
        offsets = [offset for part in request.request for offset in part.offsets]
        seqs = await self._seqs(offsets, context, what="NackFn")
        await self._settle("Nak", seqs, context)
        return pb.NackResponse(result=pb.NackResponse.Result(success=empty_pb2.Empty()))

    async def _seqs(self, offsets: Sequence[pb.Offset],
                    context: grpc.aio.ServicerContext[Any, Any], *,
                    what: str) -> dict[str, list[int]]:
        """The offsets' seqs by stream, every stream one this sidecar serves."""
        if not offsets:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{what}: a request needs at least one offset")
        seqs: dict[str, list[int]] = {}
        for offset in offsets:
            try:
                stream, seq = decode_offset(offset.offset)
            except BadOffset as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {exc}")
            if stream not in self._partition_of:
                served = ", ".join(repr(s) for s in self.config.streams.values())
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{what}: offset of stream {stream!r}, but this source "
                                    f"reads {served}")
            seqs.setdefault(stream, []).append(seq)
        return seqs

    async def _settle(self, verb: str, seqs: dict[str, list[int]],
                      context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Ack or Nak `seqs` through the cluster, every stream at once; returns once the
        consumer state holding them is committed. A seq the consumer refuses (never delivered,
        already settled) is logged and counted as done: numa cannot act on it, and a refusal
        must not stall the source."""
        outcomes = await asyncio.gather(
            *(self._settle_stream(verb, stream, stream_seqs)
              for stream, stream_seqs in seqs.items()), return_exceptions=True)
        for stream, outcome in zip(seqs, outcomes, strict=True):
            if isinstance(outcome, BackendDown):
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{verb}: {outcome}")
            if isinstance(outcome, grpc.aio.AioRpcError):
                await context.abort(outcome.code(), self._node_error(verb, stream, outcome))
            if isinstance(outcome, BaseException):
                raise outcome

    async def _settle_stream(self, verb: str, stream: str, seqs: list[int]) -> None:
        consumer = self.config.consumer
        if verb == "Ack":
            request: Any = consumers_pb2.AckRequest(stream=stream, consumer=consumer, seqs=seqs)
        else:
            request = consumers_pb2.NakRequest(stream=stream, consumer=consumer, seqs=seqs,
                                               delay_ms=self.config.nack_delay_ms)

        async def attempt() -> consumers_pb2.AckResponse:
            # The stubs are looked up per attempt: a retry may be on another node's channel.
            stub = self.backend.consumers
            answer: consumers_pb2.AckResponse = await (stub.Ack if verb == "Ack" else stub.Nak)(
                request, timeout=limits.numaflow_call_timeout_ms / 1000)
            return answer

        answer = await self.backend.call(verb, attempt)
        for result in answer.results:
            if result.HasField("error"):
                log.warning("%s of %s seq %d ignored: %s %s", verb, stream, result.seq,
                            result.error.reason, result.error.message)

    def _node_error(self, verb: str, stream: str, exc: grpc.aio.AioRpcError) -> str:
        """The message of a status passed on from the node: what failed and why."""
        err = from_rpc_error(exc)
        detail = f"{err.reason.name}: {err.message}" if err else str(exc.details())
        return f"{verb} of {stream}/{self.config.consumer}: {detail}"

    # ------------------------------------------------------------------ the rest

    async def PendingFn(self, request: empty_pb2.Empty,
                        context: grpc.aio.ServicerContext[Any, Any]) -> pb.PendingResponse:
        """The served consumers' undelivered counts, summed; -1 (numa: "unknown") when any of
        them cannot be had."""
        try:
            counts = await asyncio.gather(*(self._pending(s) for s in self.config.streams.values()))
        except (BackendDown, grpc.aio.AioRpcError) as exc:
            log.warning("pending unknown: %s", exc)
            return pb.PendingResponse(result=pb.PendingResponse.Result(count=-1))
        return pb.PendingResponse(result=pb.PendingResponse.Result(count=sum(counts)))

    async def _pending(self, stream: str) -> int:
        info_request = consumers_pb2.GetConsumerInfoRequest(stream=stream,
                                                            consumer=self.config.consumer)

        async def attempt() -> consumers_pb2.ConsumerInfo:
            info: consumers_pb2.ConsumerInfo = await self.backend.consumers.GetConsumerInfo(
                info_request, timeout=limits.numaflow_call_timeout_ms / 1000)
            return info

        info = await self.backend.call("GetConsumerInfo", attempt,
                                       budget_s=limits.numaflow_pending_retry_ms_max / 1000)
        return int(info.state.num_pending)

    async def PartitionsFn(self, request: empty_pb2.Empty,
                           context: grpc.aio.ServicerContext[Any, Any]
                           ) -> pb.PartitionsResponse:
        result = pb.PartitionsResponse.Result(partitions=list(self.config.streams))
        if self.config.total_partitions is not None:
            result.total_partitions = self.config.total_partitions
        return pb.PartitionsResponse(result=result)

    async def IsReady(self, request: empty_pb2.Empty,
                      context: grpc.aio.ServicerContext[Any, Any]) -> pb.ReadyResponse:
        return pb.ReadyResponse(ready=await self.backend.is_serving())


class _StreamFailed(Exception):
    """A node refused a call on `stream` for a reason retrying cannot mend."""

    def __init__(self, stream: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(stream)
        self.stream = stream
        self.error = error


class SetupError(Exception):
    """The cluster's answer makes the requested source impossible (one line, for the CLI)."""


async def topic_config(backend: Backend, *, topic: str, consumer: str, replica: int,
                       replicas: int, nack_delay_ms: int = 0) -> SourceConfig:
    """The config serving replica `replica`'s share of `topic`. Raises grpc.aio.AioRpcError
    (TOPIC_NOT_FOUND ...) as the node answers it, SetupError when the topic is incomplete or
    leaves this replica no partition."""
    request = topics_pb2.GetTopicRequest(name=topic)

    async def look() -> topics_pb2.TopicInfo:
        found: topics_pb2.TopicInfo = await backend.topics.GetTopic(
            request, timeout=limits.numaflow_call_timeout_ms / 1000)
        return found

    info = await backend.call("GetTopic", look)
    if not info.complete:
        raise SetupError(f"topic {topic!r} is incomplete (run `raftlog topic create {topic} "
                         f"--partitions {info.partitions}` again to finish it)")
    served = assigned_partitions(info.partitions, replica=replica, replicas=replicas)
    if not served:
        raise SetupError(f"replica {replica} of {replicas} gets no partition of topic "
                         f"{topic!r} ({info.partitions} partitions): run at most "
                         f"{info.partitions} replicas")
    streams = {p.partition: p.stream for p in info.partition_infos}
    return SourceConfig(streams={p: streams[p] for p in served}, consumer=consumer,
                        nack_delay_ms=nack_delay_ms, topic=topic,
                        total_partitions=info.partitions)


async def check_consumer(backend: Backend, config: SourceConfig, *,
                         create: consumers_pb2.ConsumerConfig | None) -> None:
    """Raises grpc.aio.AioRpcError (NOT_FOUND ...) unless every served stream has the consumer;
    with `create`, makes it first: on the stream, or as a group on every partition of the topic
    (creating an existing consumer with the same config is accepted)."""
    if create is not None:
        await _create_consumer(backend, config, create)
        return
    for stream in config.streams.values():
        info = consumers_pb2.GetConsumerInfoRequest(stream=stream, consumer=config.consumer)

        async def look(info: Any = info) -> consumers_pb2.ConsumerInfo:
            found: consumers_pb2.ConsumerInfo = await backend.consumers.GetConsumerInfo(
                info, timeout=limits.numaflow_call_timeout_ms / 1000)
            return found

        await backend.call("GetConsumerInfo", look)


async def _create_consumer(backend: Backend, config: SourceConfig,
                           create: consumers_pb2.ConsumerConfig) -> None:
    request: Any
    if config.topic is not None:
        request = topics_pb2.CreateTopicGroupRequest(topic=config.topic, config=create)

        async def make() -> Any:
            return await backend.topics.CreateTopicGroup(
                request, timeout=limits.numaflow_call_timeout_ms / 1000)
    else:
        request = consumers_pb2.CreateConsumerRequest(
            stream=next(iter(config.streams.values())), config=create)

        async def make() -> Any:
            return await backend.consumers.CreateConsumer(
                request, timeout=limits.numaflow_call_timeout_ms / 1000)

    await backend.call("CreateConsumer", make)


async def serve(*, backend: Backend, config: SourceConfig, socket_path: Path,
                server_info_path: Path | None, server_info: dict[str, Any],
                stop: asyncio.Event) -> None:
    """Serves until `stop` is set. The server-info file appears only once the socket listens
    and is removed (with the socket) on the way out."""
    server = grpc.aio.server(options=_CHANNEL_OPTIONS)
    pb_grpc.add_SourceServicer_to_server(SourceServicer(backend, config), server)
    if socket_path.exists():
        socket_path.unlink()  # a stale socket of an earlier run
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        if server_info_path is not None:
            partial = server_info_path.with_name(server_info_path.name + ".tmp")
            partial.write_text(server_info_text(server_info))
            partial.replace(server_info_path)  # numa never sees a half-written file
        log.info("serving source.v1.Source on unix://%s for %s via %s", socket_path,
                 config.reads, ",".join(backend.addresses))
        await stop.wait()
    finally:
        if server_info_path is not None:
            server_info_path.unlink(missing_ok=True)
        await server.stop(limits.numaflow_shutdown_grace_ms / 1000)
        socket_path.unlink(missing_ok=True)
