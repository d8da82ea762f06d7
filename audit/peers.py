"""The audit's signed calls to a running cluster: each member's peer listener (the node-to-node
Replication service, which takes only callers holding the cluster credential) for the steps on
its own copies, and its client listener for the one admin call a repair makes
(`Cluster.SetConsumerState`, which needs the same credential and which the node forwards to
the stream's primary). The members and their addresses come from
`export_client.cluster_members`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from raftlog.audit.export_client import Member
from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.api.cluster import admin_metadata
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

call_timeout_s = 10.0  # one peer call (a page of reads, one repair step)
read_page_messages = 1_000  # messages per ReadLocal page
principal = "audit"  # who the audit's peer calls say they are (tokens name a principal)


class PeerError(Exception):
    """A node could not be reached or refused a call; the message says which and why."""


def describe(exc: grpc.RpcError) -> str:
    """The catalogued reason and message (e.g. "COPY_CHANGED: ..."), else the gRPC status."""
    refused = from_rpc_error(exc)
    if refused is not None:
        return f"{refused.reason.name}: {refused.message}"
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code is not None else 'error'}: {details}"


class PeerNode:
    """Signed Replication calls to one member's peer listener, and its admin calls (opened on
    first use) on its client listener."""

    def __init__(self, member: Member, credential: Credential) -> None:
        if not member.peer_address:
            raise PeerError(f"{member.node_id} registered no peer listener")
        self.member = member
        self._credential = credential
        self._channel = grpc.insecure_channel(member.peer_address)
        self._stub: Any = replication_pb2_grpc.ReplicationStub(self._channel)  # type: ignore[no-untyped-call]
        self._admin_channel: grpc.Channel | None = None

    def close(self) -> None:
        self._channel.close()
        if self._admin_channel is not None:
            self._admin_channel.close()

    def _call(self, method: str, request: Any) -> Any:
        token = self._credential.token(principal=principal,
                                       method=f"/raftlog.internal.Replication/{method}")
        try:
            return getattr(self._stub, method)(request, timeout=call_timeout_s,
                                               metadata=((PEER_TOKEN_HEADER, token),))
        except grpc.RpcError as exc:
            raise PeerError(f"{self.member.node_id} {method}: {describe(exc)}") from None

    def state(self, stream: str) -> replication_pb2.ReplicaState:
        reply: replication_pb2.ReplicaState = self._call(
            "GetReplicaState", replication_pb2.GetReplicaStateRequest(stream=stream))
        return reply

    def read(self, stream: str, first_seq: int, last_seq: int
             ) -> Iterator[replication_pb2.LocalMessage]:
        """The stored messages of the local copy with seqs in [first_seq, last_seq]."""
        seq = first_seq
        while seq <= last_seq:
            window = min(read_page_messages, last_seq - seq + 1)
            page: replication_pb2.ReadLocalResponse = self._call(
                "ReadLocal", replication_pb2.ReadLocalRequest(stream=stream, from_seq=seq,
                                                              limit=window))
            if not page.state.exists:
                raise PeerError(f"{self.member.node_id} holds no copy of {stream!r}")
            yield from (message for message in page.messages if message.seq <= last_seq)
            # A page ends at the window or earlier at a byte cap (never before one message):
            # go on after the last message returned, or past an empty window.
            seq = page.messages[-1].seq + 1 if page.messages else seq + window
            if seq > page.state.last_seq:
                return

    def repair(self, request: replication_pb2.RepairRequest) -> replication_pb2.RepairReply:
        reply: replication_pb2.RepairReply = self._call("Repair", request)
        return reply

    def repair_consumer(self, request: replication_pb2.RepairConsumerRequest
                        ) -> replication_pb2.RepairConsumerReply:
        reply: replication_pb2.RepairConsumerReply = self._call("RepairConsumer", request)
        return reply

    def set_consumer_state(self, request: cluster_pb2.SetConsumerStateRequest
                           ) -> cluster_pb2.SetConsumerStateResponse:
        """Through this member's client listener, which forwards it to the stream's primary."""
        if self._admin_channel is None:
            self._admin_channel = grpc.insecure_channel(self.member.address)
        stub: Any = cluster_pb2_grpc.ClusterStub(self._admin_channel)  # type: ignore[no-untyped-call]
        try:
            reply: cluster_pb2.SetConsumerStateResponse = stub.SetConsumerState(
                request, timeout=call_timeout_s,
                metadata=admin_metadata(self._credential, "SetConsumerState"))
        except grpc.RpcError as exc:
            raise PeerError(f"{self.member.node_id} SetConsumerState: {describe(exc)}") from None
        return reply
