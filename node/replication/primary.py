"""The primary's side of data replication: links to replica nodes, per-stream progress,
the commit rule, and the read lease.

- One `PeerLink` per replica node: a long-lived bidirectional Replicate call shared by every
  stream this node leads there, opened through a `LinkTransport` (node/replication/links.py:
  gRPC on the peer listener in a node, in memory in tests). The link, not the stream,
  heartbeats (every `limits.replication_heartbeat_s`, carrying the commit seqs that moved
  since), times out (a request unanswered for `limits.replication_request_timeout_s` restarts
  the call), and keeps the clock of the lease: the send time of the latest request the replica
  acknowledged. Requests and acks travel in order on one call.
- One `StreamReplicator` per stream this node leads (replication factor > 1). It does work only
  when there is some: data not yet sent, a replica whose position is unknown, removals to pass
  on. For each replica up to `limits.replication_inflight_max` batches in flight, each
  carrying everything not yet sent (so batches grow with load); catch-up from the replica's own
  last seq (SEQ_GAP tells it), re-seed when the replica needs seqs this node no longer holds.
  An idle stream costs nothing, so thousands of them cost nothing either.
- Commit rule (G1): a seq is committed once a majority of the replica set (this node
  included, counting only its fsynced seqs) holds it at the current fence epoch.
- Fencing (G3): a refusal that names a newer epoch deposes this primary at once, and so does a
  replica's notice that a survey fenced the stream there (pushed on the same call, in order).
- Lease: reads are served only while a majority of the stream's replica set acknowledged, on
  their links, a request *sent* within `limits.primary_lease_s`; a replica fenced above this
  primary's epoch notifies it before it acknowledges anything sent later, so the lease never
  outlives a fence by more than that. Failover waits longer than the lease of silence
  (`limits.failover_after_s`) before it picks a successor. Writes fail fast (NO_QUORUM) once
  a majority has been silent for a lease: for them a replica counts while any answer of
  its link *arrived* within the lease (a slow replica whose answers come later than the lease
  after their requests still commits writes; the commit rule, not the lease, keeps them safe).

The timings and sizes are the `replication_*` names (and `primary_lease_s`,
`heartbeat_commits_sent_max`) in base/limits.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.engine.stream import Stream
from raftlog.node.replication.links import LinkCall, LinkReset, LinkTransport
from raftlog.node.transport import logctx

log = logging.getLogger(__name__)


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
    """The Replicate call to one replica node; see the module docstring."""

    def __init__(self, *, node_id: str, self_id: str, transport: LinkTransport, clock: Clock,
                 on_ack: Callable[[str, replication_pb2.ReplicateAck], None],
                 on_reset: Callable[[str], None]) -> None:
        self.node_id = node_id
        self._self_id = self_id
        self._transport = transport
        self._clock = clock
        self._on_ack = on_ack
        self._on_reset = on_reset
        self._queue: asyncio.Queue[replication_pb2.ReplicateRequest] = asyncio.Queue(
            limits.replication_link_queue_max)
        self._task: asyncio.Task[None] | None = None
        self._call: LinkCall | None = None
        self._restarting = False
        self._stopping = False  # stop() was called: the task ends, whatever reaches it
        self._next_id = 1
        self._sent: collections.deque[tuple[int, float]] = collections.deque()  # in order
        self.last_sent_s = -1e9
        self.acked_sent_s = -1e9  # send time of the latest request the replica acknowledged
        self.heard_s = -1e9  # when the latest answer of the replica arrived
        self.created_s = clock.monotonic_s()
        self.call_opened_s: float | None = None  # when the current call opened (None: none)
        self.commits: dict[str, tuple[int, int]] = {}  # stream -> (epoch, commit seq) to tell
        # The call answered since it was opened: only then do streams send on it (a dead or
        # unreachable replica costs nothing but the link's own reconnect attempts).
        self.connected = False
        self.waiting: set[StreamReplicator] = set()  # streams to kick once it is connected

    def restart(self) -> None:
        """Abandons the current call (a peer that stopped answering keeps it open)."""
        if self._call is not None and not self._restarting:
            self._restarting = True
            self._call.cancel()

    def start(self) -> None:
        # A link serves every stream it carries: it takes none of the fields of the block that
        # first needed it (a reconcile of one stream).
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"link-{self.node_id}", context=logctx.background())

    async def stop(self) -> None:
        """Ends the link's task and its call. The task's loop also ends on `_stopping`: a
        cancellation can be swallowed on its way (a gRPC call may end as a broken call
        instead, and one that lands while a restart is under way looks like the restart), and
        the loop must not go on reconnecting then."""
        self._stopping = True
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def send(self, request: replication_pb2.ReplicateRequest, *, probe: bool = False) -> int:
        """Queues a request; its id, or 0 when the link is not connected or its queue is full
        (the caller waits in `waiting`). A `probe` (a heartbeat) goes out unconnected too."""
        if self._queue.full() or not (self.connected or probe):
            return 0
        request.request_id = self._next_id
        self._next_id += 1
        now = self._clock.monotonic_s()
        self._queue.put_nowait(request)
        self._sent.append((request.request_id, now))
        self.last_sent_s = now
        return request.request_id

    def tick(self) -> None:
        """Heartbeat when idle (with the pending commit notices; unconnected, it is the
        probe whose answer connects the link); restart a stalled call; wake the streams that
        wait for room or for the connection."""
        now = self._clock.monotonic_s()
        if self._sent and now - self._sent[0][1] > limits.replication_request_timeout_s:
            log.info("replication link to %s: no answer for %.1f s; reconnecting",
                     self.node_id, now - self._sent[0][1])
            self.restart()
            return
        if self._call is not None and (
                (self.connected and (now - self.last_sent_s >= limits.replication_heartbeat_s
                                     or self.commits))
                or (not self.connected and not self._sent)):
            heartbeat = replication_pb2.ReplicateRequest(primary=self._self_id)
            carried = limits.heartbeat_commits_sent_max if self.connected else 0
            for name in list(self.commits)[:carried]:
                epoch, commit_seq = self.commits.pop(name)
                heartbeat.commits.add(stream=name, epoch=epoch, commit_seq=commit_seq)
            self.send(heartbeat, probe=True)
        if self.connected and self.waiting \
                and self._queue.qsize() < limits.replication_link_queue_max // 2:
            for _ in range(min(len(self.waiting), limits.replication_wakes_per_tick_max)):
                replicator = self.waiting.pop()
                if not replicator.stopped:
                    replicator.send_new()

    def _on_answer(self, ack: replication_pb2.ReplicateAck) -> None:
        self.heard_s = self._clock.monotonic_s()
        if ack.request_id:
            while self._sent and self._sent[0][0] <= ack.request_id:
                request_id, sent_s = self._sent.popleft()
                if request_id == ack.request_id:
                    self.acked_sent_s = max(self.acked_sent_s, sent_s)
        if ack.stream:
            self._on_ack(self.node_id, ack)

    @staticmethod
    async def _requests(queue: asyncio.Queue[replication_pb2.ReplicateRequest]
                        ) -> AsyncIterator[replication_pb2.ReplicateRequest]:
        while True:
            yield await queue.get()

    async def _run(self) -> None:
        while not self._stopping:
            was_connected = False
            # A queue per call: the request generator of a call that failed may still wait on
            # its queue, and must not take what is meant for the next call.
            self._queue = asyncio.Queue(limits.replication_link_queue_max)
            try:
                self._call = self._transport.open(self.node_id, self._requests(self._queue))
                self.call_opened_s = self._clock.monotonic_s()
                async for ack in self._call.acks():
                    if not self.connected:
                        self.connected = was_connected = True  # tick() wakes the waiting
                    self._on_answer(ack)
            except asyncio.CancelledError:
                if self._stopping or not self._restarting:
                    raise  # the link itself is being stopped
            except (LinkReset, RaftlogError) as err:
                log.debug("replication link to %s: %s", self.node_id, err)
            except Exception:
                log.exception("replication link to %s failed", self.node_id)
            self._call = None
            self.call_opened_s = None
            self._restarting = False
            self.connected = False
            self._sent.clear()  # requests queued for a broken call are lost; streams resend
            if was_connected:  # its streams sent on it: they ask again once it is back
                self._on_reset(self.node_id)
            if not self._stopping:
                await asyncio.sleep(limits.replication_reconnect_backoff_s)


@dataclass
class ReplicaProgress:
    node_id: str
    match_seq: int = 0  # last seq the replica acknowledged at this epoch
    next_seq: int | None = None  # next seq to send; None = ask the replica first
    # request id -> removals it carries; sent in order on one call
    inflight: dict[int, int] = field(default_factory=dict)
    removed_cursor: int = 0  # removals acknowledged by the replica
    removed_sent: int = 0  # removals sent to it
    reseed: bool = False
    told_commit: int = 0  # the commit seq the replica was last told
    # The replica acknowledged this stream at this epoch on the link's current call: only
    # then do the link's acks (heartbeats included) count toward this stream's read lease.
    confirmed: bool = False

    def reset(self) -> None:
        """Forget what is in flight; ask the replica where it is."""
        self.inflight.clear()
        self.next_seq = None
        self.removed_sent = self.removed_cursor
        self.confirmed = False


class StreamReplicator:
    """Replication of one stream this node leads; see the module docstring."""

    def __init__(self, *, stream: Stream, node_id: str, replicas: tuple[str, ...], epoch: int,
                 history: list[tuple[int, int]], links: LinkSet, clock: Clock) -> None:
        self.stream = stream
        self.node_id = node_id
        self.epoch = epoch
        self.history = history
        # What this primary took over from the epochs before its own: it serves reads once
        # all of it is committed (a read must not miss a write acknowledged by the old one).
        self.read_floor_seq = next((start for e, start in reversed(history) if e == epoch),
                                   1) - 1
        self._history_pb = [raft_pb2.EpochStart(fence_epoch=e, start_seq=s) for e, s in history]
        self.replica_count = len(replicas)
        self.progress = {n: ReplicaProgress(n) for n in replicas if n != node_id}
        self._links = links
        self._clock = clock
        self.stopped = False
        self.started_s = clock.monotonic_s()
        self._kick_due = False

    # --- Replicator protocol (called by Stream)

    def kick(self) -> None:
        """Sends what is new to the replicas at the next turn of the event loop, so that the
        publishes staged in one turn go out as one request per replica. Their commit waits at
        least for this node's own fsync, which takes longer than the turn."""
        if self._kick_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.send_new()
            return
        self._kick_due = True
        loop.call_soon(self.send_new)

    def send_new(self) -> None:
        """Sends what is new to each replica now (as far as its pipeline allows)."""
        self._kick_due = False
        read: dict[tuple[int, int], tuple[list[bytes], int]] = {}  # one read per position
        for progress in self.progress.values():
            self._maybe_send(progress, read=read)

    def on_local_durable(self) -> None:
        self._recompute_commit()

    def check_lease(self) -> None:
        if self.lease_remaining_s() <= 0:
            raise RaftlogError(Reason.NOT_PRIMARY, f"the primary of {self.stream.name!r} has "
                               "not heard from a majority of its replicas within its lease",
                               stream=self.stream.name)
        if self.stream.commit_seq < self.read_floor_seq:
            raise RaftlogError(Reason.CATCHING_UP, f"the new primary of {self.stream.name!r} "
                               "has not yet committed the messages it took over; retry",
                               stream=self.stream.name,
                               retry_after_ms=int(limits.replication_heartbeat_s * 1000))

    def check_writable(self) -> None:
        """Fails fast (NO_QUORUM, retryable) when no answer of a majority of the replicas
        arrived within the lease: a write would only wait for a commit that cannot come. A
        link just opened counts as answering for its first lease."""
        if self.lease_remaining_s(writes=True) <= 0:
            raise RaftlogError(Reason.NO_QUORUM, f"the primary of {self.stream.name!r} cannot "
                               "reach a majority of its replicas; retry with the same msg_id",
                               stream=self.stream.name,
                               retry_after_ms=int(limits.primary_lease_s * 1000))

    # --- lease and commit

    def lease_remaining_s(self, *, writes: bool = False) -> float:
        """For reads, a replica counts once it acknowledged this stream on its link's current
        call, or when that call has been open since before this node began to lead the
        stream (a fence since would have come on it as a notice). A call opened later, e.g.
        after a partition healed, carries heartbeats that any node answers, also one that
        follows a newer primary of this stream by now and whose fence notice went down with
        the old call. For writes, a replica counts from the arrival of its link's latest
        answer (see the module docstring)."""
        now = self._clock.monotonic_s()
        contacts = sorted([now, *(self._links.heard_s(n) if writes
                                  else self._links.acked_sent_s(n)
                                  if self._lease_counts(n, p) else -1e9
                                  for n, p in self.progress.items())], reverse=True)
        return contacts[majority(self.replica_count) - 1] + limits.primary_lease_s - now

    def _lease_counts(self, node_id: str, progress: ReplicaProgress) -> bool:
        if progress.confirmed:
            return True
        opened = self._links.call_opened_s(node_id)
        return opened is not None and opened <= self.started_s

    def _recompute_commit(self) -> None:
        positions = sorted([self.stream.durable_seq,
                            *(p.match_seq for p in self.progress.values())], reverse=True)
        before = self.stream.commit_seq
        self.stream.set_commit_seq(positions[majority(self.replica_count) - 1])
        if self.stream.commit_seq != before:
            self._tell_commit()

    def _tell_commit(self) -> None:
        """The replicas learn a commit seq that no batch carries (after the last one) from
        their link's next heartbeat."""
        commit = self.stream.commit_seq
        for progress in self.progress.values():
            if progress.told_commit < commit:
                self._links.note_commit(progress.node_id, self.stream.name, self.epoch, commit)

    # --- sending

    def _maybe_send(self, progress: ReplicaProgress,
                    read: dict[tuple[int, int], tuple[list[bytes], int]] | None = None
                    ) -> None:
        """Sends the next batch to one replica, pipelined up to
        limits.replication_inflight_max batches. `read`: the values (and their checksum) read
        for other replicas in this same turn, by (from_seq, to_seq)."""
        if self.stopped or len(progress.inflight) >= limits.replication_inflight_max:
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
                                     progress.removed_sent + limits.replication_removed_seqs_max]
        if not (unsent or removed or progress.next_seq is None):
            return
        request = replication_pb2.ReplicateRequest(
            stream=stream.name, epoch=self.epoch, primary=self.node_id,
            commit_seq=stream.commit_seq, head_seq=stream.first_seq, history=self._history_pb,
            first_seq=progress.next_seq or stream.last_seq + 1, reseed=progress.reseed)
        if unsent and progress.next_seq is not None:
            span = (progress.next_seq,
                    min(stream.last_seq,
                        progress.next_seq + limits.replication_batch_messages_max - 1))
            known = None if read is None else read.get(span)
            if known is None:
                values = stream.stored_values(from_seq=span[0], to_seq=span[1],
                                              bytes_max=limits.replication_batch_bytes_max)
                known = (values, zlib.crc32(b"".join(values)))
                if read is not None:
                    read[span] = known
            request.messages.extend(known[0])
            request.checksum = known[1]
        if removed:
            request.removed.extend(replication_pb2.SeqRange(first=a, last=b)
                                   for a, b in to_ranges(removed))
        request_id = self._links.send(progress.node_id, request)
        if not request_id:
            self._links.blocked(self, progress.node_id)
            return
        progress.inflight[request_id] = len(removed)
        progress.removed_sent += len(removed)
        progress.told_commit = max(progress.told_commit, stream.commit_seq)
        if progress.next_seq is not None:
            progress.next_seq += len(request.messages)
            progress.reseed = False

    def on_reset(self, node_id: str) -> None:
        progress = self.progress.get(node_id)
        if progress is not None:
            progress.reset()
            self._links.blocked(self, node_id)  # ask the replica again once the link is back

    # --- acks

    def on_ack(self, node_id: str, ack: replication_pb2.ReplicateAck) -> None:
        progress = self.progress.get(node_id)
        if progress is None:
            return
        if not ack.request_id:  # a notice the replica pushed: a survey fenced the stream
            if ack.refused:
                self._on_refused(progress, ack)
            return
        removals = progress.inflight.pop(ack.request_id, None)
        if removals is None:
            return  # from before a reset
        if ack.refused:
            self._on_refused(progress, ack)
            return
        if ack.epoch != self.epoch:
            return
        progress.confirmed = True
        progress.match_seq = max(progress.match_seq, ack.last_seq)
        if progress.next_seq is None:
            progress.next_seq = ack.last_seq + 1
        if removals:
            progress.removed_cursor += removals
            self._trim_removed_log()
        self._recompute_commit()
        self._maybe_send(progress)

    def _on_refused(self, progress: ReplicaProgress, ack: replication_pb2.ReplicateAck) -> None:
        progress.reset()
        if ack.refused == Reason.STALE_EPOCH.name and ack.replica_epoch > self.epoch:
            log.warning("stream %s: replica %s is at epoch %d, above ours (%d); stepping down",
                        self.stream.name, progress.node_id, ack.replica_epoch, self.epoch,
                        extra=self._log_fields())
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
        log.info("stream %s: replica %s refused a batch: %s %s; asking again in %.1f s",
                 self.stream.name, progress.node_id, ack.refused, ack.message,
                 limits.replication_refused_retry_s, extra=self._log_fields())
        # e.g. its copy is being created
        self._links.retry(self, after_s=limits.replication_refused_retry_s)

    def _log_fields(self) -> dict[str, str | int]:
        """A line about this stream, written from a link's task (which serves many)."""
        return logctx.fields(stream=self.stream.name, epoch=self.epoch)

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

    def __init__(self, *, node_id: str, transport: LinkTransport, clock: Clock) -> None:
        self._node_id = node_id
        self._transport = transport
        self._clock = clock
        self._links: dict[str, PeerLink] = {}
        self.replicators: dict[str, StreamReplicator] = {}
        self.later: dict[StreamReplicator, float] = {}  # refused: try again at this time

    def link(self, node_id: str) -> PeerLink:
        link = self._links.get(node_id)
        if link is None:
            link = PeerLink(node_id=node_id, self_id=self._node_id, transport=self._transport,
                            clock=self._clock, on_ack=self._on_ack, on_reset=self._on_reset)
            link.start()
            self._links[node_id] = link
        return link

    def send(self, node_id: str, request: replication_pb2.ReplicateRequest) -> int:
        return self.link(node_id).send(request)

    def note_commit(self, node_id: str, stream: str, epoch: int, commit_seq: int) -> None:
        self.link(node_id).commits[stream] = (epoch, commit_seq)

    def call_opened_s(self, node_id: str) -> float | None:
        """When the link's current call to the node opened (None: no call)."""
        link = self._links.get(node_id)
        return None if link is None else link.call_opened_s

    def acked_sent_s(self, node_id: str) -> float:
        """Send time of the latest request the node acknowledged (the read lease's clock)."""
        link = self._links.get(node_id)
        return -1e9 if link is None else link.acked_sent_s

    def heard_s(self, node_id: str) -> float:
        """When the node's latest answer arrived, a link's opening counting as one (a link
        not opened yet: now); the clock of the writes' fail-fast."""
        link = self._links.get(node_id)
        if link is None:
            return self._clock.monotonic_s()
        return max(link.heard_s, link.created_s)

    def blocked(self, replicator: StreamReplicator, node_id: str) -> None:
        """The replicator could not send to the node: the link kicks it when it can."""
        self.link(node_id).waiting.add(replicator)

    def retry(self, replicator: StreamReplicator, *, after_s: float) -> None:
        self.later[replicator] = self._clock.monotonic_s() + after_s

    def restart(self, node_id: str) -> None:
        link = self._links.get(node_id)
        if link is not None:
            link.restart()

    def tick(self) -> None:
        for link in list(self._links.values()):
            link.tick()
        if self.later:
            now = self._clock.monotonic_s()
            due = [r for r, at in self.later.items() if at <= now]
            for replicator in due:
                del self.later[replicator]
                if not replicator.stopped:
                    replicator.send_new()

    def forget(self, replicator: StreamReplicator) -> None:
        for link in self._links.values():
            link.waiting.discard(replicator)
        self.later.pop(replicator, None)

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
    """The streams this node leads with replication factor > 1, and the links' ticking."""

    def __init__(self, *, node_id: str, transport: LinkTransport, clock: Clock) -> None:
        """`transport` opens the Replicate calls: `GrpcLinkTransport(peers)` in a node."""
        self.node_id = node_id
        self.links = LinkSet(node_id=node_id, transport=transport, clock=clock)
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
        replicator.send_new()

    def release(self, name: str) -> None:
        replicator = self.links.replicators.pop(name, None)
        if replicator is not None:
            replicator.stop()
            self.links.forget(replicator)
            if replicator.stream.replicator is replicator:
                replicator.stream.replicator = None

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(limits.replication_heartbeat_s / 2)
            try:
                self.links.tick()
            except Exception:
                log.exception("replication tick failed")
