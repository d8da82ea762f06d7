"""The primary's side of data replication: links to replica nodes, per-stream progress,
the commit rule, and the read lease.

- One `PeerLink` per replica node: a long-lived bidirectional Replicate call shared by every
  stream this node leads there; it reconnects with a bounded backoff and routes acks back.
- One `StreamReplicator` per stream this node leads (replication factor > 1): for each replica,
  one batch in flight at a time carrying everything not yet sent (so batches grow with load),
  heartbeats when idle, catch-up from the replica's own last seq (SEQ_GAP tells it), re-seed
  when the replica needs seqs this node no longer holds.
- Commit rule (G1): a seq is committed once a majority of the replica set (this node
  included, counting only its fsynced seqs) holds it at the current fence epoch.
- Fencing (G3): a refusal that names a newer epoch deposes this primary at once.
- Lease: reads are served only while a majority acknowledged a request *sent* within
  `lease_s`; failover waits longer than that before it picks a successor.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlog.node.clock import Clock
from raftlog.node.errors import RaftlogError, Reason
from raftlog.node.peer import PeerClient
from raftlog.node.stream import Stream
from raftlog.node.stream_replica import removed_seqs_max
from raftlog.v1 import raft_pb2, replication_pb2

log = logging.getLogger(__name__)

lease_s = 0.5  # reads need a majority ack of a request sent this recently
heartbeat_s = 0.05  # an idle replica hears from its primary this often
request_timeout_s = 2.0  # a batch not acknowledged by then is sent again
reconnect_backoff_s = 0.1  # between attempts to reopen a link
batch_bytes_max = 1024 * 1024  # stored bytes in one replication batch
batch_messages_max = 10_000  # messages in one replication batch
link_queue_max = 10_000  # requests waiting on one link
inflight_max = 4  # batches sent to one replica and not yet acknowledged


def majority(count: int) -> int:
    return count // 2 + 1


def to_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


class PeerLink:
    """The Replicate call to one replica node."""

    def __init__(self, *, node_id: str, peers: PeerClient,
                 on_ack: Callable[[str, replication_pb2.ReplicateAck], None],
                 on_reset: Callable[[str], None]) -> None:
        self.node_id = node_id
        self._peers = peers
        self._on_ack = on_ack
        self._on_reset = on_reset
        self._queue: asyncio.Queue[replication_pb2.ReplicateRequest] = asyncio.Queue(
            link_queue_max)
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._restarting = False
        self.connected = False

    def restart(self) -> None:
        """Abandons the current call (a peer that stopped answering keeps it open)."""
        if self._call is not None and not self._restarting:
            self._restarting = True
            self._call.cancel()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"link-{self.node_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def send(self, request: replication_pb2.ReplicateRequest) -> bool:
        try:
            self._queue.put_nowait(request)
        except asyncio.QueueFull:
            return False
        return True

    async def _requests(self) -> AsyncIterator[replication_pb2.ReplicateRequest]:
        while True:
            yield await self._queue.get()

    async def _run(self) -> None:
        while True:
            try:
                self._call = self._peers.replicate(self.node_id, self._requests())
                self.connected = True
                async for ack in self._call:
                    self._on_ack(self.node_id, ack)
            except asyncio.CancelledError:
                if not self._restarting:
                    raise  # the link itself is being stopped
            except (grpc.aio.AioRpcError, RaftlogError) as err:
                log.debug("replication link to %s: %s", self.node_id, err)
            except Exception:
                log.exception("replication link to %s failed", self.node_id)
            self._call = None
            self._restarting = False
            self.connected = False
            # Requests queued for a broken call are lost; their streams resend.
            while not self._queue.empty():
                self._queue.get_nowait()
            self._on_reset(self.node_id)
            await asyncio.sleep(reconnect_backoff_s)


@dataclass
class ReplicaProgress:
    node_id: str
    match_seq: int = 0  # last seq the replica acknowledged at this epoch
    next_seq: int | None = None  # next seq to send; None = ask the replica first
    # request id -> (send time, removals it carries); sent in order on one call
    inflight: dict[int, tuple[float, int]] = field(default_factory=dict)
    last_sent_s: float = 0.0
    acked_sent_s: float = -1e9  # send time of the latest acknowledged request (lease)
    removed_cursor: int = 0  # removals acknowledged by the replica
    removed_sent: int = 0  # removals sent to it
    reseed: bool = False

    def reset(self) -> None:
        """Forget what is in flight; ask the replica where it is."""
        self.inflight.clear()
        self.next_seq = None
        self.removed_sent = self.removed_cursor


class StreamReplicator:
    """Replication of one stream this node leads; see the module docstring."""

    def __init__(self, *, stream: Stream, node_id: str, replicas: tuple[str, ...], epoch: int,
                 history: list[tuple[int, int]], links: LinkSet, clock: Clock) -> None:
        self.stream = stream
        self.node_id = node_id
        self.epoch = epoch
        self.history = history
        self.replica_count = len(replicas)
        self.progress = {n: ReplicaProgress(n) for n in replicas if n != node_id}
        self._links = links
        self._clock = clock
        self._next_id = 1
        self.stopped = False

    # --- Replicator protocol (called by Stream)

    def kick(self) -> None:
        for progress in self.progress.values():
            self._maybe_send(progress)

    def on_local_durable(self) -> None:
        self._recompute_commit()

    def check_lease(self) -> None:
        if self.lease_remaining_s() <= 0:
            raise RaftlogError(Reason.NOT_PRIMARY, f"the primary of {self.stream.name!r} has "
                               "not heard from a majority of its replicas within its lease",
                               stream=self.stream.name)

    # --- lease and commit

    def lease_remaining_s(self) -> float:
        now = self._clock.monotonic_s()
        contacts = sorted([now, *(p.acked_sent_s for p in self.progress.values())],
                          reverse=True)
        return contacts[majority(self.replica_count) - 1] + lease_s - now

    def _recompute_commit(self) -> None:
        positions = sorted([self.stream.durable_seq,
                            *(p.match_seq for p in self.progress.values())], reverse=True)
        self.stream.set_commit_seq(positions[majority(self.replica_count) - 1])

    # --- sending

    def _maybe_send(self, progress: ReplicaProgress, *, heartbeat: bool = False) -> None:
        """Sends the next batch to one replica, pipelined up to inflight_max batches."""
        if self.stopped or len(progress.inflight) >= inflight_max:
            return
        if progress.next_seq is None and progress.inflight:
            return  # a probe is out; wait for the replica's position
        stream = self.stream
        if progress.next_seq is not None and progress.next_seq < stream.first_seq and \
                progress.next_seq <= stream.last_seq and not progress.inflight:
            progress.reseed = True
            progress.next_seq = stream.first_seq
        unsent = progress.next_seq is not None and progress.next_seq <= stream.last_seq
        removed = stream.removed_log[progress.removed_sent:
                                     progress.removed_sent + removed_seqs_max]
        idle = heartbeat and not progress.inflight
        if not (unsent or removed or idle or progress.next_seq is None):
            return
        request = replication_pb2.ReplicateRequest(
            stream=stream.name, epoch=self.epoch, primary=self.node_id,
            commit_seq=stream.commit_seq, head_seq=stream.first_seq,
            history=[raft_pb2.EpochStart(fence_epoch=e, start_seq=s) for e, s in self.history],
            first_seq=progress.next_seq or stream.last_seq + 1, reseed=progress.reseed,
            request_id=self._next_id,
        )
        if unsent and progress.next_seq is not None:
            values = stream.stored_values(
                from_seq=progress.next_seq,
                to_seq=min(stream.last_seq, progress.next_seq + batch_messages_max - 1),
                bytes_max=batch_bytes_max)
            request.messages.extend(values)
            request.checksum = zlib.crc32(b"".join(values))
        if removed:
            request.removed.extend(replication_pb2.SeqRange(first=a, last=b)
                                   for a, b in to_ranges(removed))
        if not self._links.send(progress.node_id, request):
            return
        now = self._clock.monotonic_s()
        progress.inflight[self._next_id] = (now, len(removed))
        progress.last_sent_s = now
        progress.removed_sent += len(removed)
        if progress.next_seq is not None:
            progress.next_seq += len(request.messages)
            progress.reseed = False
        self._next_id += 1

    def tick(self) -> None:
        now = self._clock.monotonic_s()
        for progress in self.progress.values():
            oldest = min((sent for sent, _ in progress.inflight.values()), default=now)
            if now - oldest > request_timeout_s:
                progress.reset()  # lost; send again on a fresh call
                self._links.restart(progress.node_id)
            self._maybe_send(progress, heartbeat=now - progress.last_sent_s >= heartbeat_s)

    def on_reset(self, node_id: str) -> None:
        progress = self.progress.get(node_id)
        if progress is not None:
            progress.reset()

    # --- acks

    def on_ack(self, node_id: str, ack: replication_pb2.ReplicateAck) -> None:
        progress = self.progress.get(node_id)
        if progress is None:
            return
        sent = progress.inflight.pop(ack.request_id, None)
        if sent is None:
            return  # from before a reset
        if ack.refused:
            self._on_refused(progress, ack)
            return
        if ack.epoch != self.epoch:
            return
        sent_s, removals = sent
        progress.match_seq = max(progress.match_seq, ack.last_seq)
        if progress.next_seq is None:
            progress.next_seq = ack.last_seq + 1
        progress.acked_sent_s = max(progress.acked_sent_s, sent_s)
        if removals:
            progress.removed_cursor += removals
            self._trim_removed_log()
        self._recompute_commit()
        self._maybe_send(progress)

    def _on_refused(self, progress: ReplicaProgress, ack: replication_pb2.ReplicateAck) -> None:
        progress.reset()
        if ack.refused == Reason.STALE_EPOCH.name and ack.replica_epoch > self.epoch:
            log.warning("stream %s: replica %s is at epoch %d, above ours (%d); stepping down",
                        self.stream.name, progress.node_id, ack.replica_epoch, self.epoch)
            self.stop()
            self.stream.depose(RaftlogError(
                Reason.NOT_PRIMARY, f"this node is no longer the primary of "
                f"{self.stream.name!r} (fence epoch {ack.replica_epoch} exists)",
                stream=self.stream.name))
            return
        if ack.refused == Reason.SEQ_GAP.name:
            progress.next_seq = ack.last_seq + 1
            self._maybe_send(progress)
            return
        log.info("stream %s: replica %s refused a batch: %s %s", self.stream.name,
                 progress.node_id, ack.refused, ack.message)

    def _trim_removed_log(self) -> None:
        done = min(p.removed_cursor for p in self.progress.values())
        if done:
            del self.stream.removed_log[:done]
            for progress in self.progress.values():
                progress.removed_cursor -= done
                progress.removed_sent -= done

    def stop(self) -> None:
        self.stopped = True


class LinkSet:
    """Links to every replica node, created on first use; routes acks to replicators."""

    def __init__(self, *, peers: PeerClient) -> None:
        self._peers = peers
        self._links: dict[str, PeerLink] = {}
        self.replicators: dict[str, StreamReplicator] = {}

    def send(self, node_id: str, request: replication_pb2.ReplicateRequest) -> bool:
        link = self._links.get(node_id)
        if link is None:
            link = PeerLink(node_id=node_id, peers=self._peers, on_ack=self._on_ack,
                            on_reset=self._on_reset)
            link.start()
            self._links[node_id] = link
        return link.send(request)

    def restart(self, node_id: str) -> None:
        link = self._links.get(node_id)
        if link is not None:
            link.restart()

    def _on_ack(self, node_id: str, ack: replication_pb2.ReplicateAck) -> None:
        replicator = self.replicators.get(ack.stream)
        if replicator is not None:
            replicator.on_ack(node_id, ack)

    def _on_reset(self, node_id: str) -> None:
        for replicator in self.replicators.values():
            replicator.on_reset(node_id)

    async def close(self) -> None:
        for link in self._links.values():
            await link.stop()
        self._links.clear()


class ReplicationManager:
    """The streams this node leads with replication factor > 1, and their ticking."""

    def __init__(self, *, node_id: str, peers: PeerClient, clock: Clock) -> None:
        self.node_id = node_id
        self.links = LinkSet(peers=peers)
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick_forever(),
                                                            name="replication-tick")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for name in list(self.links.replicators):
            self.release(name)
        await self.links.close()

    def lead(self, stream: Stream, *, replicas: tuple[str, ...], epoch: int,
             history: list[tuple[int, int]]) -> None:
        """Starts (or restarts, at a new epoch) replicating a stream this node is primary of."""
        current = self.links.replicators.get(stream.name)
        if current is not None and current.epoch == epoch and \
                set(current.progress) == {n for n in replicas if n != self.node_id}:
            return
        self.release(stream.name)
        if len(replicas) <= 1:
            stream.replicator = None
            return
        replicator = StreamReplicator(stream=stream, node_id=self.node_id, replicas=replicas,
                                      epoch=epoch, history=history, links=self.links,
                                      clock=self._clock)
        self.links.replicators[stream.name] = replicator
        stream.replicator = replicator
        replicator.kick()

    def release(self, name: str) -> None:
        replicator = self.links.replicators.pop(name, None)
        if replicator is not None:
            replicator.stop()
            if replicator.stream.replicator is replicator:
                replicator.stream.replicator = None

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(heartbeat_s / 2)
            for replicator in list(self.links.replicators.values()):
                try:
                    replicator.tick()
                except Exception:
                    log.exception("replication tick of %s failed", replicator.stream.name)
