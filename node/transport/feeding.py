"""Feeding the requests of a client- or bidi-streaming call from an async iterator, in a task
that ends with the call.

grpc.aio can drain a request iterator itself (pass it when making the call), but its drainer is
cancelled only when this side cancels the call. When the call ends otherwise (the peer died or
refused, the connection dropped), the drainer keeps waiting for the iterator's next request; an
iterator fed by a queue that nobody fills any more (a replication link's, which reopens its call
with a new queue) then never yields, and each such call leaves a pending task and a suspended
async generator behind. The garbage collector finds them later, and asyncio logs "Task was
destroyed but it is pending" and "aclose(): asynchronous generator is already running" for each.

`feed` makes the call without an iterator and drains it in a task of its own, cancelled the
moment the call is done, however it ended: the iterator is closed there and then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

log = logging.getLogger(__name__)


def feed(call: Any, requests: AsyncIterator[Any], *, name: str = "feed") -> asyncio.Task[None]:
    """Writes what `requests` yields to `call` (a streaming-request grpc.aio call made without
    a request iterator), then half-closes it. The task is cancelled when the call is done, and
    closes `requests` on its way out; an iterator that raises cancels the call."""

    async def drain() -> None:
        try:
            async for request in requests:
                await call.write(request)
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the call ended: whoever reads its answer sees why
        except Exception:
            log.exception("the requests of a %s call failed; cancelling it", name)
            call.cancel()
        finally:
            await _close(requests)

    task = asyncio.get_running_loop().create_task(drain(), name=name)
    call.add_done_callback(lambda _: task.cancel())
    return task


async def _close(requests: AsyncIterator[Any]) -> None:
    close = getattr(requests, "aclose", None)
    if close is not None:
        await close()
