"""All streams of a node: lifecycle, lookup, the consumer hooks, and the retention sweep.

The engine owns the `Stream` objects (stream.py) and the ConsumerManager's view of them, and
keeps them in one `MessageStore` (store.py). Runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.engine.store import MessageStore
from raftlog.node.engine.stream import Stream
from raftlog.node.engine.stream_config import apply_update, validate_config
from raftlog.node.engine.stream_publish import Appended, Draft
from raftlog.v1 import streams_pb2, types_pb2

log = logging.getLogger(__name__)


class ConsumerHooks(Protocol):
    """What the engine tells the consumers of its streams (ConsumerManager implements it)."""

    def attach_stream(self, log: Stream, *, retention: int, subjects: Sequence[str]) -> None: ...
    def update_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None: ...
    def detach_stream(self, stream: str) -> None: ...
    def consumer_count(self, stream: str) -> int: ...
    def on_purged(self, stream: str) -> None: ...
    async def maybe_trim_interest(self, stream: str) -> int: ...
    def check_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None: ...


class NoConsumers:
    """ConsumerHooks for a node (or test) without consumers."""

    def attach_stream(self, log: Stream, *, retention: int, subjects: Sequence[str]) -> None:
        pass

    def update_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None:
        pass

    def detach_stream(self, stream: str) -> None:
        pass

    def consumer_count(self, stream: str) -> int:
        return 0

    def on_purged(self, stream: str) -> None:
        pass

    async def maybe_trim_interest(self, stream: str) -> int:
        return 0

    def check_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None:
        pass


class StreamEngine:
    def __init__(
        self,
        *,
        store: MessageStore,
        clock: Clock,
        consumers: ConsumerHooks,
        follow_raft: bool = False,
    ) -> None:
        """The streams are kept in `store` (RocksMessageStore, or the in-memory twin).

        With `follow_raft` (cluster mode) a stream serves nothing until the cluster gives
        it a role (Stream.become_primary / become_replica) and its commit seq starts at 0:
        what is stored here was not necessarily committed."""
        self._follow_raft = follow_raft
        self._store = store
        self._clock = clock
        self.consumers = consumers
        self.streams: dict[str, Stream] = {}
        self._next_stream_id = 1
        self._config_locks: dict[str, asyncio.Lock] = {}  # one config change at a time
        self._pruned_by_config: dict[str, int] = {}  # see pruned_by_config()
        self._sweeper: asyncio.Task[None] | None = None
        # The user who owns a stream, from the cluster's metadata (set by the node in cluster
        # mode; a standalone node has no users).
        self.owner_of: Callable[[str], str] = lambda name: ""

    # ----------------------------------------------------------------- startup

    def load(self) -> None:
        self._next_stream_id = self._store.next_stream_id()
        for name, value in self._store.records():
            record = storage_pb2.StreamRecord.FromString(value)
            if record.config.name != name:
                raise RaftlogError(Reason.CORRUPT_RECORD, f"stream record {name!r} names "
                                   f"{record.config.name!r}")
            self._attach(record).load()
        log.info("loaded %d streams", len(self.streams))

    def _attach(self, record: storage_pb2.StreamRecord) -> Stream:
        stream = Stream(store=self._store, clock=self._clock, record=record)
        if self._follow_raft:
            stream.become_replica()
            stream.reset_commit_seq()
        self.streams[stream.name] = stream
        self.consumers.attach_stream(stream, retention=record.config.retention,
                                     subjects=list(record.config.subjects))
        return stream

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    # ----------------------------------------------------------------- lifecycle

    def get(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {name!r}", stream=name)
        return stream

    def info(self, name: str) -> types_pb2.StreamInfo:
        stream = self.get(name)
        return types_pb2.StreamInfo(
            config=stream.config,
            state=stream.state(consumers=self.consumers.consumer_count(name)),
            created_ms=stream.record.created_ms,
            owner=self.owner_of(name),
        )

    def infos(self, prefix: str = "") -> list[types_pb2.StreamInfo]:
        return [self.info(name) for name in sorted(self.streams) if name.startswith(prefix)]

    async def create(self, config: types_pb2.StreamConfig) -> types_pb2.StreamInfo:
        config = validate_config(config)
        existing = self.streams.get(config.name)
        if existing is not None:
            if existing.config == config:
                return self.info(config.name)
            raise RaftlogError(Reason.STREAM_EXISTS,
                               f"stream {config.name!r} exists with a different config",
                               stream=config.name)
        if len(self.streams) >= limits.streams_per_node_max:
            raise RaftlogError(Reason.TOO_MANY_STREAMS,
                               f"a node holds at most {limits.streams_per_node_max} streams",
                               limit=limits.streams_per_node_max)
        record = storage_pb2.StreamRecord(
            stream_id=self._next_stream_id, config=config, created_ms=self._clock.wall_ms(),
            first_seq=1, last_seq=0, epoch=1,
        )
        self._next_stream_id += 1
        batch = self._store.batch()
        batch.put_next_stream_id(self._next_stream_id)
        batch.put_record(config.name, record.SerializeToString())
        self._store.write(batch)
        self._attach(record)
        await self._store.durable()
        return self.info(config.name)

    async def update(self, request: streams_pb2.UpdateStreamRequest) -> tuple[
        types_pb2.StreamInfo, int
    ]:
        stream = self.get(request.name)
        config = apply_update(stream.config, request)
        self.consumers.check_stream_subjects(stream.name, list(config.subjects))
        pruned = await self.apply_config(stream.name, config)
        return self.info(stream.name), pruned

    async def apply_config(self, name: str, config: types_pb2.StreamConfig) -> int:
        """Makes a committed config (from the metadata group) the stream's config; returns
        how many messages that pruned. Changes of one stream's config run one at a time."""
        async with self._config_locks.setdefault(name, asyncio.Lock()):
            stream = self.get(name)
            config = validate_config(config)
            stream.record.config.CopyFrom(config)
            self.consumers.update_stream_subjects(name, list(config.subjects))
            pruned = await stream.enforce_limits()
            pruned += await stream.expire(now_ms=self._clock.wall_ms())
            batch = self._store.batch()
            batch.put_record(name, stream.record.SerializeToString())
            self._store.write(batch)
            await self._store.durable()
            self._pruned_by_config[name] = self._pruned_by_config.get(name, 0) + pruned
            return pruned

    def pruned_by_config(self, name: str) -> int:
        """Messages config changes have pruned from the local copy so far (a running count).
        Whichever applies a committed config first, the update call or the cluster's
        reconcile, the count's growth across an update is what that update pruned."""
        return self._pruned_by_config.get(name, 0)

    async def delete(self, name: str) -> None:
        stream = self.get(name)
        stream.close()
        del self.streams[name]
        self._config_locks.pop(name, None)
        self._pruned_by_config.pop(name, None)
        self.consumers.detach_stream(name)
        batch = self._store.batch()
        batch.delete_stream(stream.stream_id, name)
        self._store.write(batch)
        await self._store.durable()

    async def purge(self, request: streams_pb2.PurgeStreamRequest) -> int:
        stream = self.get(request.name)
        purged = await stream.purge(subject=request.subject, below_seq=request.below_seq,
                                    keep=request.keep)
        self.consumers.on_purged(stream.name)
        return purged

    # ----------------------------------------------------------------- publishing

    async def publish(self, name: str, drafts: Sequence[Draft]) -> list[Appended | RaftlogError]:
        stream = self.get(name)
        results = await stream.publish(drafts)
        await self._after_commit(stream)
        return results

    async def commit(self, name: str, wait_seq: int) -> None:
        """Completes publishes staged with Stream.publish_staged (PublishStream)."""
        stream = self.streams.get(name)
        if stream is not None:
            await stream.commit(wait_seq)
            await self._after_commit(stream)

    async def _after_commit(self, stream: Stream) -> None:
        if stream.config.retention != types_pb2.RETENTION_POLICY_INTEREST:
            return
        # Interest retention keeps a message only while some consumer wants it.
        await self.consumers.maybe_trim_interest(stream.name)

    # ----------------------------------------------------------------- retention sweep

    async def sweep_once(self) -> int:
        now_ms = self._clock.wall_ms()
        removed = 0
        for stream in list(self.streams.values()):
            if not stream.closed:
                removed += await stream.expire(now_ms=now_ms)
        return removed

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(limits.retention_sweep_period_ms / 1000)
            try:
                await self.sweep_once()
            except Exception:
                log.exception("retention sweep failed")
