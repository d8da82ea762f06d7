"""PublishFrames: frames of messages over one call, pipelined, answered in order.

Each frame is one PublishBatch (one stream); it is published as a PublishBatch would be (here
when this node is the stream's primary, else forwarded there) and answered by its
PublishBatchResponse, or by one error per message when the whole frame fails (unknown stream,
too many messages, not permitted, primary unreachable). A failed frame does not end the call.

Order: the answers come in the order of the frames. The frames of one stream are stored in
their order: a frame served here is staged before its publish first waits (publish_batch runs
up to its commit without suspending, and the frames' tasks start in the order they were read);
a frame forwarded to another node waits until the previous frame of its stream is answered
(two calls in flight to one node may be served in either order).

Flow: at most limits.publish_frames_inflight_max frames are unanswered at once; beyond, the
call reads no further (gRPC's flow control then holds the client back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from raftlog.base import limits
from raftlog.base.errors import RaftlogError
from raftlog.node.transport import rpc
from raftlog.v1 import streams_pb2

Publish = Callable[[streams_pb2.PublishBatchRequest], Awaitable[streams_pb2.PublishBatchResponse]]
# The node a stream's frames are forwarded to; None: served here.
PrimaryOf = Callable[[str], str | None]

_END = None


def failed_frame(frame: streams_pb2.PublishBatchRequest, err: RaftlogError
                 ) -> streams_pb2.PublishBatchResponse:
    """The answer to a frame none of whose messages was stored."""
    count = max(len(frame.entries), 1)
    error = streams_pb2.PublishResult(error=rpc.to_error_pb(err))
    return streams_pb2.PublishBatchResponse(results=[error] * count, failed=count,
                                            stream=frame.stream)


class FramePipeline:
    """One PublishFrames call's frames in flight."""

    def __init__(self, publish: Publish, primary_of: PrimaryOf) -> None:
        self._publish = publish
        self._primary_of = primary_of
        self._answers: asyncio.Queue[asyncio.Task[streams_pb2.PublishBatchResponse] | None] = \
            asyncio.Queue()
        self._room = asyncio.Semaphore(limits.publish_frames_inflight_max)  # frames unanswered
        # The newest frame of each stream forwarded elsewhere, which the next one waits for.
        self._forwarded: dict[str, asyncio.Task[streams_pb2.PublishBatchResponse]] = {}
        self._tasks: set[asyncio.Task[streams_pb2.PublishBatchResponse]] = set()

    async def run(self, frames: AsyncIterator[streams_pb2.PublishBatchRequest]
                  ) -> AsyncIterator[streams_pb2.PublishBatchResponse]:
        reader = asyncio.get_running_loop().create_task(self._read(frames),
                                                        name="publish-frames-reader")
        try:
            while (task := await self._answers.get()) is not _END:
                answer = await task
                self._room.release()
                yield answer
            await reader  # a frame that did not parse ends the call with its error
        finally:
            reader.cancel()
            for pending in self._tasks:
                pending.cancel()  # stored frames stay stored; nobody waits for their answer

    async def _read(self, frames: AsyncIterator[streams_pb2.PublishBatchRequest]) -> None:
        """Starts each frame as it arrives; then queues the end (also after a frame that did
        not parse, whose error `run` raises once the answers before it are out)."""
        try:
            while True:
                await self._room.acquire()  # read no frame beyond the bound
                frame = await anext(frames, None)
                if frame is None:
                    break
                self._answers.put_nowait(self._start(frame))
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._answers.put_nowait(_END)
            raise
        self._answers.put_nowait(_END)

    def _start(self, frame: streams_pb2.PublishBatchRequest
               ) -> asyncio.Task[streams_pb2.PublishBatchResponse]:
        try:
            remote = self._primary_of(frame.stream) is not None
        except RaftlogError:
            remote = False  # publish_batch finds the same error and answers with it
        before = self._forwarded.get(frame.stream) if remote else None
        task = asyncio.get_running_loop().create_task(self._answer(frame, before))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if remote:
            self._forwarded[frame.stream] = task
        return task

    async def _answer(self, frame: streams_pb2.PublishBatchRequest,
                      before: asyncio.Task[streams_pb2.PublishBatchResponse] | None
                      ) -> streams_pb2.PublishBatchResponse:
        if before is not None:
            await asyncio.wait({before})
        try:
            return await self._publish(frame)
        except RaftlogError as err:
            return failed_frame(frame, err)
