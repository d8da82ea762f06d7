"""PublishFrames' pipeline (node/ops/publish_frames.py): answers in frame order, frames of one
stream forwarded elsewhere one after the other, a failed frame answered per message, and no
more frames read than the bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.publish_frames import FramePipeline
from raftlog.v1 import streams_pb2
from tests.async_tests import run_async


def frame(stream: str, count: int = 2, tag: str = "") -> streams_pb2.PublishBatchRequest:
    return streams_pb2.PublishBatchRequest(stream=stream, entries=[
        streams_pb2.PublishEntry(subject=f"{stream}.x", payload=tag.encode())
        for _ in range(count)])


async def frames_of(items: list[streams_pb2.PublishBatchRequest]
                    ) -> AsyncIterator[streams_pb2.PublishBatchRequest]:
    for item in items:
        yield item


class FakePublish:
    """Answers frame k (by its payload tag) once `release[k]` is set; records the starts."""

    def __init__(self, count: int) -> None:
        self.release = [asyncio.Event() for _ in range(count)]
        self.started: list[int] = []
        self.done: list[int] = []

    async def __call__(self, request: streams_pb2.PublishBatchRequest
                       ) -> streams_pb2.PublishBatchResponse:
        k = int(request.entries[0].payload)
        self.started.append(k)
        if request.stream == "missing":
            raise RaftlogError(Reason.STREAM_NOT_FOUND, "no such stream")
        await self.release[k].wait()
        self.done.append(k)
        return streams_pb2.PublishBatchResponse(acked=len(request.entries), first_seq=k + 1,
                                                stream=request.stream)


async def collect(pipeline: FramePipeline, items: list[streams_pb2.PublishBatchRequest]
                  ) -> list[streams_pb2.PublishBatchResponse]:
    return [answer async for answer in pipeline.run(frames_of(items))]


@run_async
async def test_answers_come_in_frame_order_although_later_frames_finish_first() -> None:
    fake = FakePublish(5)
    items = [frame("local", tag=str(k)) for k in range(5)]
    task = asyncio.create_task(collect(FramePipeline(fake, lambda _: None), items))
    await asyncio.sleep(0.01)
    assert fake.started == [0, 1, 2, 3, 4]  # all pipelined at once
    for k in reversed(range(5)):
        fake.release[k].set()
        await asyncio.sleep(0)
    answers = await task
    assert fake.done == [4, 3, 2, 1, 0]
    assert [a.first_seq for a in answers] == [1, 2, 3, 4, 5]


@run_async
async def test_frames_forwarded_for_one_stream_go_one_after_the_other() -> None:
    fake = FakePublish(4)
    items = [frame("far", tag="0"), frame("other", tag="1"), frame("far", tag="2"),
             frame("far", tag="3")]
    task = asyncio.create_task(collect(FramePipeline(fake, lambda _: "n2:1"), items))
    await asyncio.sleep(0.01)
    assert fake.started == [0, 1]  # frame 2 waits for frame 0 (same stream), 1 does not
    fake.release[0].set()
    await asyncio.sleep(0.01)
    assert fake.started == [0, 1, 2]
    for event in fake.release:
        event.set()
    answers = await task
    assert [a.first_seq for a in answers] == [1, 2, 3, 4]
    assert fake.done.index(2) < fake.done.index(3)


@run_async
async def test_a_failed_frame_answers_each_message_with_the_error_and_the_call_goes_on() -> None:
    fake = FakePublish(3)
    for event in fake.release:
        event.set()
    items = [frame("s", tag="0"), frame("missing", count=3, tag="1"), frame("s", tag="2")]
    answers = await collect(FramePipeline(fake, lambda _: None), items)
    assert [a.acked for a in answers] == [2, 0, 2]
    failed = answers[1]
    assert failed.failed == 3 and len(failed.results) == 3
    assert all(r.error.reason == Reason.STREAM_NOT_FOUND.name for r in failed.results)


@run_async
async def test_no_more_frames_are_read_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "publish_frames_inflight_max", 3)
    fake = FakePublish(10)
    read: list[int] = []

    async def counted() -> AsyncIterator[streams_pb2.PublishBatchRequest]:
        for k in range(10):
            read.append(k)
            yield frame("s", tag=str(k))

    answers: list[streams_pb2.PublishBatchResponse] = []

    async def consume() -> None:
        async for answer in FramePipeline(fake, lambda _: None).run(counted()):
            answers.append(answer)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    assert read == [0, 1, 2] and fake.started == [0, 1, 2]
    fake.release[0].set()
    await asyncio.sleep(0.01)
    assert read == [0, 1, 2, 3]  # one answered: one more read
    for event in fake.release:
        event.set()
    await task
    assert len(answers) == 10


@run_async
async def test_a_frame_that_fails_to_arrive_ends_the_call_after_the_answers_before_it() -> None:
    fake = FakePublish(2)
    for event in fake.release:
        event.set()

    async def broken() -> AsyncIterator[streams_pb2.PublishBatchRequest]:
        yield frame("s", tag="0")
        yield frame("s", tag="1")
        raise RaftlogError(Reason.MALFORMED_REQUEST, "does not parse")

    answers: list[streams_pb2.PublishBatchResponse] = []
    with pytest.raises(RaftlogError) as caught:
        async for answer in FramePipeline(fake, lambda _: None).run(broken()):
            answers.append(answer)
    assert caught.value.reason is Reason.MALFORMED_REQUEST
    assert len(answers) == 2
