"""The source tails of a node: every limits.source_reconcile_period_ms it starts a tail
(source_tail.py) for each source of each stream it leads, and stops the tails of streams it no
longer leads (deposed, moved, deleted). A tail runs on the sourcing stream's primary only; the
engine refuses the appends of a primary that lost the stream, so two tails of one source never
both write, even while a deposed node has not yet noticed.

`SourceRunner` is started and stopped by the node (server.py); what its tails report is in
`StreamOps.tails` (source_status.py), read by GetStreamInfo and GetStreamSources.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.node.engine.stream import ROLE_PRIMARY, Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops.leader_loops import ReconcileLoop
from raftlog.node.ops.source_status import TailStatus
from raftlog.node.ops.source_tail import SourceTail
from raftlog.node.ops.streams import StreamOps
from raftlog.v1 import types_pb2

log = logging.getLogger(__name__)


def leads(stream: Stream) -> bool:
    """This node is the stream's primary and was not deposed."""
    return stream.role == ROLE_PRIMARY and stream.deposed is None and not stream.closed


@dataclass
class _Running:
    stream_id: int  # of the sourcing stream: a stream deleted and created again is another
    tail: SourceTail
    task: asyncio.Task[None]


class SourceRunner(ReconcileLoop[tuple[str, str]]):
    def __init__(self, *, streams: StreamOps, engine: StreamEngine, clock: Clock,
                 node_id: str) -> None:
        super().__init__(period_s=limits.source_reconcile_period_ms / 1000,
                         what="source tails")
        self._streams = streams
        self._engine = engine
        self._clock = clock
        self._node_id = node_id
        self._running: dict[tuple[str, str], _Running] = {}

    @property
    def running(self) -> dict[tuple[str, str], _Running]:
        return self._running

    def reconcile(self) -> None:
        """Starts the tails this node should run and stops the others."""
        wanted: dict[tuple[str, str], tuple[int, types_pb2.StreamSource]] = {}
        for name, stream in list(self._engine.streams.items()):
            if stream.config.sources and leads(stream):
                for source in stream.config.sources:
                    wanted[(name, source.stream)] = (stream.stream_id, source)
        for key, running in list(self._running.items()):
            want = wanted.get(key)
            if (want is None or want[0] != running.stream_id or want[1] != running.tail.source
                    or running.task.done()):
                self._stop(key)
        for key, (stream_id, source) in wanted.items():
            if key not in self._running:
                self._begin(key, stream_id, source)

    def _begin(self, key: tuple[str, str], stream_id: int,
               source: types_pb2.StreamSource) -> None:
        status = TailStatus(sourcing_stream=key[0], source_stream=key[1], node=self._node_id)
        tail = SourceTail(streams=self._streams, engine=self._engine, sourcing=key[0],
                          source=source, status=status, clock=self._clock)
        task = asyncio.get_running_loop().create_task(tail.run(),
                                                      name=f"source {key[0]}<-{key[1]}")
        self._running[key] = _Running(stream_id=stream_id, tail=tail, task=task)
        self._streams.tails.add(status)
        log.info("source tail %s <- %s started", *key)

    def _stop(self, key: tuple[str, str]) -> None:
        running = self._running.pop(key)
        running.task.cancel()
        running.task.add_done_callback(_report_end)
        self._streams.tails.remove(running.tail.status)
        log.info("source tail %s <- %s stopped", *key)


def _report_end(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        error = task.exception()
        if error is not None:
            log.error("source tail %s ended with %r", task.get_name(), error)
