"""Load generators for `raftlog pub --count` and `scripts/bench`: publish (unary, batch,
client-streaming) and fetch+ack loops over a `Client`, each bounded in messages and in time.

A loop stops at its message count, at its time limit, or at the first failed call (a benchmark
figure measured across errors would mislead); the result says which. Latencies are per call,
taken on the client (`time.perf_counter`), so they include the client's own overhead.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlog.node.cli.client import Client, describe_failure
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2

# Ack calls a fetch loop keeps running while it fetches on. An Ack call returns once its acks are
# saved through Raft (12-18 ms under load, docs/benchmarks.md), so with 4 the loop waited on the
# saves and not on the node; 32 keeps it fetching (measured: 4 -> 32 gave +16-66% at batch 100).
ack_calls_inflight_max = 32


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of `values` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class LoadResult:
    """What one loop did. `msgs` counts messages the node confirmed (published or acked)."""

    msgs: int = 0
    calls: int = 0
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    first_error: str = ""
    stopped_by: str = "count"  # count | time | error | drained

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "msgs": self.msgs,
            "calls": self.calls,
            "elapsed_s": round(self.elapsed_s, 3),
            "msgs_per_s": round(self.msgs_per_s, 1),
            "p50_ms": round(percentile(self.latencies_ms, 0.50), 3),
            "p99_ms": round(percentile(self.latencies_ms, 0.99), 3),
            "max_ms": round(max(self.latencies_ms, default=0.0), 3),
            "stopped_by": self.stopped_by,
            "error": self.first_error or None,
        }


class _Quota:
    """Hands out message counts until `count` or `time_limit_s` is reached, or a call failed."""

    def __init__(self, *, count: int, time_limit_s: float, result: LoadResult) -> None:
        self._left = count
        self._deadline = time.monotonic() + time_limit_s
        self._result = result

    def claim(self, wanted: int) -> int:
        if self._result.first_error:
            return 0
        if time.monotonic() >= self._deadline:
            if self._left > 0:
                self._result.stopped_by = "time"
            return 0
        granted = min(wanted, self._left)
        self._left -= granted
        return granted

    def give_back(self, unused: int) -> None:
        self._left += unused

    def fail(self, message: str) -> None:
        if not self._result.first_error:
            self._result.first_error = message
            self._result.stopped_by = "error"


async def _run_workers(workers: int, worker: Any, result: LoadResult) -> LoadResult:
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    result.elapsed_s = time.perf_counter() - started
    return result


async def _timed(result: LoadResult, quota: _Quota, client: Client, call: Any) -> Any:
    """Runs one call, records its latency, and turns a failure into `quota.fail`."""
    started = time.perf_counter()
    try:
        answer = await call
    except grpc.RpcError as exc:
        quota.fail(describe_failure(exc, address=client.address))
        return None
    result.latencies_ms.append((time.perf_counter() - started) * 1000)
    result.calls += 1
    return answer


def _batch_failures(response: streams_pb2.PublishBatchResponse) -> str:
    for item in response.results:
        if item.HasField("error"):
            return f"error: {item.error.reason}: {item.error.message}"
    return ""


async def publish_unary(
    client: Client,
    *,
    stream: str,
    subject: str,
    payload: bytes,
    count: int,
    callers: int,
    time_limit_s: float,
) -> LoadResult:
    """`callers` tasks each publishing one message per call, one call in flight each."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    request = streams_pb2.PublishRequest(stream=stream, subject=subject, payload=payload)

    async def caller() -> None:
        while quota.claim(1):
            call = client.streams.Publish(request, timeout=client.deadline_s())
            if await _timed(result, quota, client, call) is not None:
                result.msgs += 1

    return await _run_workers(callers, caller, result)


async def publish_batch(
    client: Client,
    *,
    stream: str,
    subject: str,
    payload: bytes,
    count: int,
    batch: int,
    inflight: int,
    time_limit_s: float,
) -> LoadResult:
    """PublishBatch calls of `batch` messages, `inflight` calls at a time."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    entry = streams_pb2.PublishEntry(subject=subject, payload=payload)
    full = streams_pb2.PublishBatchRequest(stream=stream, entries=[entry] * batch)

    async def sender() -> None:
        while size := quota.claim(batch):
            request = (
                full
                if size == batch
                else streams_pb2.PublishBatchRequest(stream=stream, entries=[entry] * size)
            )
            call = client.streams.PublishBatch(request, timeout=client.deadline_s())
            response = await _timed(result, quota, client, call)
            if response is None:
                return
            result.msgs += response.acked
            if response.failed:
                quota.fail(_batch_failures(response))

    return await _run_workers(inflight, sender, result)


async def publish_stream(
    client: Client,
    *,
    stream: str,
    subject: str,
    payload: bytes,
    count: int,
    per_call: int,
    inflight: int,
    time_limit_s: float,
) -> LoadResult:
    """Client-streaming PublishStream calls of `per_call` messages, `inflight` calls at a time."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    request = streams_pb2.PublishRequest(stream=stream, subject=subject, payload=payload)

    async def sender() -> None:
        while size := quota.claim(per_call):
            call = client.streams.PublishStream(
                itertools.repeat(request, size), timeout=client.deadline_s(extra_s=size / 1000)
            )
            response = await _timed(result, quota, client, call)
            if response is None:
                return
            result.msgs += response.acked
            if response.failed:
                quota.fail(_batch_failures(response))

    return await _run_workers(inflight, sender, result)


async def publish_frames(
    client: Client,
    *,
    stream: str,
    subject: str,
    payload: bytes,
    count: int,
    per_frame: int,
    window: int,
    time_limit_s: float,
) -> LoadResult:
    """One PublishFrames call: frames of `per_frame` messages, at most `window` unanswered.
    Latencies are per frame, from its send to its answer; `calls` counts frames."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    entry = streams_pb2.PublishEntry(subject=subject, payload=payload)
    room = asyncio.Semaphore(window)
    sent_at: deque[float] = deque()

    async def frames() -> AsyncIterator[streams_pb2.PublishBatchRequest]:
        while True:
            await room.acquire()
            size = quota.claim(per_frame)
            if not size:
                return
            sent_at.append(time.perf_counter())
            yield streams_pb2.PublishBatchRequest(stream=stream, entries=[entry] * size)

    started = time.perf_counter()
    call = client.streams.PublishFrames(frames(),
                                        timeout=client.deadline_s(extra_s=time_limit_s))
    try:
        async for answer in call:
            result.latencies_ms.append((time.perf_counter() - sent_at.popleft()) * 1000)
            result.calls += 1
            result.msgs += answer.acked
            if answer.failed:
                quota.fail(_batch_failures(answer))
            room.release()
    except grpc.RpcError as exc:
        quota.fail(describe_failure(exc, address=client.address))
    result.elapsed_s = time.perf_counter() - started
    return result


async def fetch_ack(
    client: Client,
    *,
    stream: str,
    consumer: str,
    count: int,
    batch: int,
    time_limit_s: float,
    max_wait_ms: int = 1000,
) -> LoadResult:
    """Fetch `batch` messages, then ack their seqs in one Ack call that runs while the next fetch
    goes out (at most `ack_calls_inflight_max` at a time). Stops when a fetch comes back empty.
    `msgs` counts messages whose Ack call succeeded; latencies are those of the Fetch calls."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    slots = asyncio.Semaphore(ack_calls_inflight_max)
    acks: set[asyncio.Task[None]] = set()

    async def ack(seqs: list[int]) -> None:
        try:
            request = consumers_pb2.AckRequest(stream=stream, consumer=consumer, seqs=seqs)
            try:
                reply = await client.consumers.Ack(request, timeout=client.deadline_s())
            except grpc.RpcError as exc:
                quota.fail(describe_failure(exc, address=client.address))
                return
            result.msgs += len(seqs) - sum(1 for r in reply.results if r.HasField("error"))
        finally:
            slots.release()

    started = time.perf_counter()
    while size := quota.claim(batch):
        request = consumers_pb2.FetchRequest(
            stream=stream, consumer=consumer, batch=size, max_wait_ms=max_wait_ms
        )
        call = client.consumers.Fetch(
            request, timeout=client.deadline_s(extra_s=max_wait_ms / 1000)
        )
        response = await _timed(result, quota, client, call)
        if response is None:
            break
        messages: list[types_pb2.Message] = list(response.messages)
        if not messages:
            result.stopped_by = "drained"
            break
        quota.give_back(size - len(messages))
        await slots.acquire()
        task = asyncio.create_task(ack([m.seq for m in messages]))
        acks.add(task)
        task.add_done_callback(acks.discard)
    await asyncio.gather(*acks)
    result.elapsed_s = time.perf_counter() - started
    return result


async def fetch_carrying_acks(
    client: Client,
    *,
    stream: str,
    consumer: str,
    count: int,
    batch: int,
    time_limit_s: float,
    max_wait_ms: int = 1000,
) -> LoadResult:
    """Fetch `batch` messages, each fetch carrying the acks of the messages the one before it
    brought (`FetchRequest.ack_seqs`, saved behind the answer); after the last fetch, one Ack
    call of the last batch, whose return means every ack before it is saved too. `msgs` counts
    the accepted acks only once that Ack returned (none after a failed call); latencies are
    those of the Fetch calls."""
    result = LoadResult()
    quota = _Quota(count=count, time_limit_s=time_limit_s, result=result)
    carried: list[int] = []
    accepted = 0
    started = time.perf_counter()
    while size := quota.claim(batch):
        request = consumers_pb2.FetchRequest(stream=stream, consumer=consumer, batch=size,
                                             max_wait_ms=max_wait_ms, ack_seqs=carried)
        call = client.consumers.Fetch(request, timeout=client.deadline_s(
            extra_s=max_wait_ms / 1000))
        response = await _timed(result, quota, client, call)
        if response is None:
            break
        accepted += len(carried) - _refused(response.acks.results)
        carried = [m.seq for m in response.messages]
        quota.give_back(size - len(carried))
        if not carried:
            result.stopped_by = "drained"
            break
    if carried and not result.first_error:
        last = consumers_pb2.AckRequest(stream=stream, consumer=consumer, seqs=carried)
        try:
            reply = await client.consumers.Ack(last, timeout=client.deadline_s())
        except grpc.RpcError as exc:
            quota.fail(describe_failure(exc, address=client.address))
        else:
            accepted += len(carried) - _refused(reply.results)
    result.msgs = 0 if result.first_error else accepted
    result.elapsed_s = time.perf_counter() - started
    return result


def _refused(results: Any) -> int:
    return sum(1 for r in results if r.HasField("error"))
