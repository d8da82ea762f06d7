"""Members of the metadata state machine: join, leave, status (the handlers `apply` calls)."""

from __future__ import annotations

from raftlog.base.errors import Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import (
    ALIVE,
    Member,
    MetaState,
    address_bytes_max,
    members_max,
    node_id_bytes_max,
)
from raftlog.raft.state_rules import accepted, require, require_member


def member_join(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    join = command.member_join
    require(0 < len(join.node_id.encode()) <= node_id_bytes_max, Reason.INVALID_ARGUMENT,
            f"node_id must be 1..{node_id_bytes_max} bytes")
    for what, address in (("raft_address", join.raft_address),
                          ("grpc_address", join.grpc_address)):
        require(0 < len(address.encode()) <= address_bytes_max, Reason.INVALID_ARGUMENT,
                f"{what} must be 1..{address_bytes_max} bytes")
    require(len(join.peer_address.encode()) <= address_bytes_max, Reason.INVALID_ARGUMENT,
            f"peer_address must be at most {address_bytes_max} bytes")
    require(join.node_id not in state.members, Reason.NODE_EXISTS,
            f"node {join.node_id!r} is already a member")
    for other in state.members.values():
        require(join.raft_address != other.raft_address, Reason.NODE_EXISTS,
                f"raft address {join.raft_address} belongs to {other.node_id!r}")
        require(join.grpc_address != other.grpc_address, Reason.NODE_EXISTS,
                f"grpc address {join.grpc_address} belongs to {other.node_id!r}")
        require(not join.peer_address or join.peer_address != other.peer_address,
                Reason.NODE_EXISTS,
                f"peer address {join.peer_address} belongs to {other.node_id!r}")
    require(len(state.members) < members_max, Reason.INVALID_ARGUMENT,
            f"a cluster has at most {members_max} members")
    state.members[join.node_id] = Member(
        node_id=join.node_id, raft_address=join.raft_address, grpc_address=join.grpc_address,
        status=ALIVE, since_ms=command.now_ms, joined_ms=command.now_ms,
        peer_address=join.peer_address,
    )
    return accepted()


def member_leave(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    node_id = command.member_leave.node_id
    require_member(state, node_id)
    require(len(state.members) > 1, Reason.LAST_MEMBER,
            f"node {node_id!r} is the last member")
    held = state.streams_held_by(node_id)
    require(not held, Reason.NODE_IN_USE,
            f"node {node_id!r} still holds {len(held)} streams (e.g. {held[:3]}); move them first")
    del state.members[node_id]
    return accepted()


def member_set_status(state: MetaState, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
    update = command.member_set_status
    member = require_member(state, update.node_id)
    require(update.status in (raft_pb2.MEMBER_STATUS_ALIVE, raft_pb2.MEMBER_STATUS_SUSPECT,
                               raft_pb2.MEMBER_STATUS_DEAD),
            Reason.INVALID_ARGUMENT, f"unknown member status {update.status}")
    if member.status == update.status:
        return accepted(changed=False)  # keeps the earlier `since_ms`
    member.status = update.status
    member.since_ms = update.since_ms or command.now_ms
    return accepted()
