"""Builders of metadata commands: one keyword-only function per `RaftCommand` kind, so callers
never swap two node ids or two epochs by position. `now_ms` is left 0 unless given: the group
stamps it when proposing."""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.internal import raft_pb2
from raftlog.v1 import consumers_pb2, types_pb2

Command = raft_pb2.RaftCommand


def member_join(*, node_id: str, raft_address: str, grpc_address: str, peer_address: str = "",
                now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, member_join=raft_pb2.MemberJoin(
        node_id=node_id, raft_address=raft_address, grpc_address=grpc_address,
        peer_address=peer_address))


def member_leave(*, node_id: str, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, member_leave=raft_pb2.MemberLeave(node_id=node_id))


def member_set_status(*, node_id: str, status: raft_pb2.MemberStatus.ValueType,
                      since_ms: int = 0, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, member_set_status=raft_pb2.MemberSetStatus(
        node_id=node_id, status=status, since_ms=since_ms))


def stream_create(*, config: types_pb2.StreamConfig, replicas: Iterable[str], primary: str,
                  fence_epoch: int = 1, epoch_start_seq: int = 1, now_ms: int = 0,
                  owner: str = "") -> Command:
    return Command(now_ms=now_ms, stream_create=raft_pb2.StreamCreate(
        config=config, replicas=list(replicas), primary=primary, fence_epoch=fence_epoch,
        epoch_start_seq=epoch_start_seq, owner=owner))


def stream_update(*, name: str, config: types_pb2.StreamConfig | None = None,
                  replicas: Iterable[str] = (), now_ms: int = 0) -> Command:
    update = raft_pb2.StreamUpdate(name=name, replicas=list(replicas))
    if config is not None:
        update.config.CopyFrom(config)
    return Command(now_ms=now_ms, stream_update=update)


def stream_delete(*, name: str, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, stream_delete=raft_pb2.StreamDelete(name=name))


def stream_promote(*, stream: str, new_primary: str, new_fence_epoch: int,
                   epoch_start_seq: int, replicas: Iterable[str] = (), now_ms: int = 0
                   ) -> Command:
    return Command(now_ms=now_ms, stream_promote=raft_pb2.StreamPromote(
        stream=stream, new_primary=new_primary, new_fence_epoch=new_fence_epoch,
        epoch_start_seq=epoch_start_seq, replicas=list(replicas)))


def stream_promotes(*, promotes: Iterable[raft_pb2.StreamPromote], now_ms: int = 0
                    ) -> Command:
    return Command(now_ms=now_ms, stream_promotes=raft_pb2.StreamPromotes(
        promotes=list(promotes)))


def authority_set_override(*, stream: str, claimant: str, fence_epoch: int,
                           epoch_start_seq: int, pinned: bool = False, now_ms: int = 0
                           ) -> Command:
    return Command(now_ms=now_ms, authority_set_override=raft_pb2.AuthoritySetOverride(
        stream=stream, claimant=claimant, fence_epoch=fence_epoch,
        epoch_start_seq=epoch_start_seq, pinned=pinned))


def authority_clear_override(*, stream: str, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms,
                   authority_clear_override=raft_pb2.AuthorityClearOverride(stream=stream))


def authority_set_pinned(*, stream: str, pinned: bool, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, authority_set_pinned=raft_pb2.AuthoritySetPinned(
        stream=stream, pinned=pinned))


def consumer_create(*, stream: str, config: consumers_pb2.ConsumerConfig, now_ms: int = 0
                    ) -> Command:
    return Command(now_ms=now_ms,
                   consumer_create=raft_pb2.ConsumerCreate(stream=stream, config=config))


def consumer_delete(*, stream: str, consumer: str, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms,
                   consumer_delete=raft_pb2.ConsumerDelete(stream=stream, consumer=consumer))


def consumer_progress(*, stream: str, consumer: str, ack_floor: int = 0,
                      acked: Iterable[int] = (), delivered_seq: int = 0, fence_epoch: int = 0
                      ) -> raft_pb2.ConsumerProgress:
    """`fence_epoch`: the epoch of the primary that took the acks (0 = not checked)."""
    return raft_pb2.ConsumerProgress(stream=stream, consumer=consumer, ack_floor=ack_floor,
                                     acked=list(acked), delivered_seq=delivered_seq,
                                     fence_epoch=fence_epoch)


def consumer_state_update(*, updates: Iterable[raft_pb2.ConsumerProgress], now_ms: int = 0
                          ) -> Command:
    return Command(now_ms=now_ms, consumer_state_update=raft_pb2.ConsumerStateUpdate(
        updates=list(updates)))


def consumer_state_set(*, stream: str, consumer: str, ack_floor: int, acked: Iterable[int],
                       delivered_seq: int, commit_seq: int, fence_epoch: int = 0,
                       expect: consumers_pb2.ConsumerStateExpect | None = None,
                       now_ms: int = 0) -> Command:
    """`commit_seq`: the stream's committed end on the proposer (no value may pass it);
    `fence_epoch`: the proposing primary's (0 = not checked); `expect`: the state the consumer
    must still have (None = not compared)."""
    request = raft_pb2.ConsumerStateSet(
        stream=stream, consumer=consumer, ack_floor=ack_floor, acked=sorted(acked),
        delivered_seq=delivered_seq, commit_seq=commit_seq, fence_epoch=fence_epoch)
    if expect is not None:
        request.expect.CopyFrom(expect)
    return Command(now_ms=now_ms, consumer_state_set=request)


def user_put(*, user: raft_pb2.UserRecord, create: bool, now_ms: int = 0) -> Command:
    """`create`: a new user (USER_EXISTS if taken); else a replace of its rules, tokens kept."""
    return Command(now_ms=now_ms, user_put=raft_pb2.UserPut(user=user, create=create))


def user_delete(*, name: str, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, user_delete=raft_pb2.UserDelete(name=name))


def user_tokens(*, name: str, add: Iterable[raft_pb2.TokenRecord] = (),
                keep_newest_only: bool = False, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, user_tokens=raft_pb2.UserTokens(
        name=name, add=list(add), keep_newest_only=keep_newest_only))


def barrier(*, now_ms: int = 0) -> Command:
    return Command(now_ms=now_ms, barrier=raft_pb2.Barrier())
