"""Collectors: what the cluster holds now. `read_stream` reads a stream through the public API
(every subject scanned page by page, then GetMessage probes of seqs the scans did not return);
`read_replicas` reads every node's local copy (`ReadLocal` on its peer listener);
`wait_replicas_converged` and `wait_caught_up` wait for the copies; `explain_route` and
`create_stream` set a run up. Every read is bounded (pages, probes, attempts, deadlines). Part of
the workload (chaos/workload.py re-exports it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from raftlog.chaos.clients import Clock, CollectError, Nodes, PeerAccess, error_name, rpc
from raftlog.chaos.history import decode_payload
from raftlog.internal import replication_pb2
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

read_page_max = 1_000  # messages per ScanExactAtSubject / ReadLocal page
read_pages_max = 10_000
gap_probes_max = 200  # GetMessage probes of seqs the scans did not return


@dataclass(frozen=True)
class StoredView:
    seq: int
    subject: str
    msg_id: str  # the msg_id field as stored ('' when published without one)
    payload_id: str | None  # decoded from the payload; None when it is not a workload payload


@dataclass
class StreamContents:
    """The stream as the public API serves it (`read_stream`)."""

    stream: str
    first_seq: int
    last_seq: int
    commit_seq: int
    messages: dict[int, StoredView] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def visible_last_seq(self) -> int:
        """The last seq readers may see: the commit seq when the node reports one."""
        return min(self.last_seq, self.commit_seq) if self.commit_seq else self.last_seq


async def read_stream(addresses: Sequence[str], stream: str, *,
                      call_timeout_s: float = 5.0) -> StreamContents:
    """Every message of `stream`, read through any node: all its subjects (ListSubjectsByPrefix)
    scanned page by page, then GetMessage probes of seqs the scans did not return."""
    nodes = Nodes(addresses)
    try:
        info = await rpc(nodes, "streams", "GetStreamInfo",
                         streams_pb2.GetStreamInfoRequest(name=stream), timeout_s=call_timeout_s)
        state = info.state
        contents = StreamContents(stream, int(state.first_seq), int(state.last_seq),
                                  int(state.commit_seq))
        listing = await rpc(nodes, "streams", "ListSubjectsByPrefix",
                            streams_pb2.ListSubjectsByPrefixRequest(stream=stream, limit=100_000),
                            timeout_s=call_timeout_s)
        if listing.truncated:
            contents.notes.append("subject listing truncated; probing the rest by seq")
        for summary in listing.subjects:
            await _scan_subject(nodes, contents, summary.subject, call_timeout_s=call_timeout_s)
        await _probe_unseen(nodes, contents, call_timeout_s=call_timeout_s)
    except grpc.RpcError as exc:
        raise CollectError(f"cannot read stream {stream!r}: {error_name(exc)}") from exc
    finally:
        await nodes.close()
    return contents


def _view(message: types_pb2.Message) -> StoredView:
    return StoredView(int(message.seq), message.subject, message.msg_id,
                      decode_payload(message.payload))


async def _scan_subject(nodes: Nodes, contents: StreamContents, subject: str, *,
                        call_timeout_s: float) -> None:
    from_seq = 0
    for _ in range(read_pages_max):
        request = streams_pb2.ScanExactAtSubjectRequest(
            stream=contents.stream, subject=subject, from_seq=from_seq, limit=read_page_max)
        page = await rpc(nodes, "streams", "ScanExactAtSubject", request,
                         timeout_s=call_timeout_s)
        for message in page.messages:
            contents.messages[int(message.seq)] = _view(message)
        if not page.next_seq or not page.messages:
            return
        from_seq = int(page.next_seq)
    contents.notes.append(f"scan of {subject!r} stopped after {read_pages_max} pages")


async def _probe_unseen(nodes: Nodes, contents: StreamContents, *, call_timeout_s: float) -> None:
    unseen = [seq for seq in range(contents.first_seq, contents.visible_last_seq + 1)
              if seq not in contents.messages]
    for seq in unseen[:gap_probes_max]:
        request = streams_pb2.GetMessageRequest(stream=contents.stream, seq=seq)
        try:
            message = await rpc(nodes, "streams", "GetMessage", request,
                                timeout_s=call_timeout_s)
        except grpc.RpcError as exc:
            if error_name(exc) == "MESSAGE_NOT_FOUND":
                continue
            raise
        contents.messages[seq] = _view(message)
    if len(unseen) > gap_probes_max:
        contents.notes.append(f"{len(unseen)} seqs unseen by the scans; probed {gap_probes_max}")


@dataclass(frozen=True)
class ReplicaCopy:
    """One node's local copy of a stream (ReadLocal): its position and stored bytes."""

    node: str
    address: str
    epoch: int
    first_seq: int
    last_seq: int
    commit_seq: int
    stored: dict[int, bytes]


@dataclass
class ReplicaSurvey:
    copies: list[ReplicaCopy] = field(default_factory=list)
    primary: str = ""  # node id, from ExplainRoute ('' when unknown)
    replicas: tuple[str, ...] = ()  # node ids the route names
    notes: list[str] = field(default_factory=list)

    @property
    def primary_commit_seq(self) -> int | None:
        for copy in self.copies:
            if copy.node == self.primary:
                return copy.commit_seq
        return None


async def read_replicas(addresses: Sequence[str], stream: str, *,
                        call_timeout_s: float = 5.0,
                        peer: PeerAccess | None = None) -> ReplicaSurvey:
    """ReadLocal on every node in `addresses` (on its peer listener, through `peer`); nodes
    without a copy, unreachable, or not serving ReadLocal are left out and named in `notes`."""
    survey = ReplicaSurvey()
    nodes = Nodes(addresses, peer=peer)
    try:
        try:
            route = await rpc(nodes, "cluster", "ExplainRoute",
                              cluster_pb2.ExplainRouteRequest(stream=stream),
                              timeout_s=call_timeout_s, attempts_max=len(addresses))
            survey.primary, survey.replicas = route.primary, tuple(route.replicas)
        except grpc.RpcError as exc:
            survey.notes.append(f"ExplainRoute failed everywhere: {error_name(exc)}")
        for address in addresses:
            try:
                copy = await _read_copy(nodes, address, stream, call_timeout_s=call_timeout_s)
            except grpc.RpcError as exc:
                survey.notes.append(f"{address}: ReadLocal {error_name(exc)}")
                continue
            if copy is None:
                survey.notes.append(f"{address}: holds no copy of {stream!r}")
            else:
                survey.copies.append(copy)
    finally:
        await nodes.close()
    return survey


async def _read_copy(nodes: Nodes, address: str, stream: str, *,
                     call_timeout_s: float) -> ReplicaCopy | None:
    stub = nodes.replication(address)
    stored: dict[int, bytes] = {}
    from_seq = 1
    state = None
    for _ in range(read_pages_max):
        page = await stub.ReadLocal(replication_pb2.ReadLocalRequest(
            stream=stream, from_seq=from_seq, limit=read_page_max), timeout=call_timeout_s)
        state = page.state if state is None else state
        if not page.state.exists:
            return None
        for message in page.messages:
            stored[int(message.seq)] = bytes(message.stored)
        if not page.messages or page.messages[-1].seq >= state.last_seq:
            break
        from_seq = int(page.messages[-1].seq) + 1
    if state is None:  # read_pages_max < 1: nothing was read
        raise CollectError(f"{address}: ReadLocal read no page of {stream!r}")
    return ReplicaCopy(state.node_id or address, address, int(state.epoch), int(state.first_seq),
                       int(state.last_seq), int(state.commit_seq), stored)


async def wait_replicas_converged(addresses: Sequence[str], stream: str, *, copies_min: int,
                                  timeout_s: float, clock: Clock = time.monotonic,
                                  peer: PeerAccess | None = None) -> bool:
    """Until at least `copies_min` nodes hold the stream with one last_seq equal to one
    commit_seq (nothing in flight, nobody behind); False at the timeout or when the nodes do
    not serve GetReplicaState."""
    nodes = Nodes(addresses, peer=peer)
    request = replication_pb2.GetReplicaStateRequest(stream=stream)

    async def converged() -> bool:
        states = []
        for address in addresses:
            try:
                state = await nodes.replication(address).GetReplicaState(request, timeout=1.0)
            except grpc.RpcError as exc:
                if error_name(exc) == "UNIMPLEMENTED":
                    raise
                continue
            if state.exists:
                states.append((state.last_seq, state.commit_seq))
        return len(states) >= copies_min and len({seq for pair in states for seq in pair}) == 1

    deadline = clock() + timeout_s
    try:
        while clock() < deadline:
            if await converged():
                return True
            await asyncio.sleep(0.05)
    except grpc.RpcError:
        return False
    finally:
        await nodes.close()
    return False


async def wait_caught_up(addresses: Sequence[str], stream: str, *, replica: str,
                         timeout_s: float, clock: Clock = time.monotonic,
                         peer: PeerAccess | None = None) -> float | None:
    """Until the node at address `replica` holds everything its stream's primary had
    committed when asked just before it (so it works under a steady publisher); seconds
    taken, or None at the timeout."""
    nodes = Nodes(addresses, peer=peer)
    request = replication_pb2.GetReplicaStateRequest(stream=stream)
    started = clock()
    try:
        while clock() - started < timeout_s:
            try:
                route = await rpc(nodes, "cluster", "ExplainRoute",
                                  cluster_pb2.ExplainRouteRequest(stream=stream), timeout_s=1.0,
                                  attempts_max=len(nodes.addresses))
                primary = await nodes.replication(route.primary_grpc_address).GetReplicaState(
                    request, timeout=1.0)
                copy = await nodes.replication(replica).GetReplicaState(request, timeout=1.0)
                if copy.exists and primary.commit_seq and copy.last_seq >= primary.commit_seq:
                    return clock() - started
            except grpc.RpcError:
                pass
            await asyncio.sleep(0.05)
    finally:
        await nodes.close()
    return None


async def explain_route(addresses: Sequence[str], stream: str, *,
                        timeout_s: float = 2.0) -> cluster_pb2.RouteExplanation:
    nodes = Nodes(addresses)
    try:
        route: cluster_pb2.RouteExplanation = await rpc(
            nodes, "cluster", "ExplainRoute", cluster_pb2.ExplainRouteRequest(stream=stream),
            timeout_s=timeout_s, attempts_max=len(addresses))
        return route
    finally:
        await nodes.close()


async def create_stream(addresses: Sequence[str], stream: str, *, subjects: Sequence[str],
                        replicas: int = 3, timeout_s: float = 10.0) -> types_pb2.StreamInfo:
    """Creates a limits-retention stream (the checker assumes nothing is removed). A retry
    that finds the stream created by an attempt that timed out returns its info."""
    nodes = Nodes(addresses)
    config = types_pb2.StreamConfig(name=stream, subjects=list(subjects), replicas=replicas)
    try:
        try:
            info: types_pb2.StreamInfo = await rpc(
                nodes, "streams", "CreateStream", streams_pb2.CreateStreamRequest(config=config),
                timeout_s=timeout_s)
        except grpc.RpcError as exc:
            if error_name(exc) != "STREAM_EXISTS":
                raise
            info = await rpc(nodes, "streams", "GetStreamInfo",
                             streams_pb2.GetStreamInfoRequest(name=stream), timeout_s=timeout_s)
        return info
    finally:
        await nodes.close()
