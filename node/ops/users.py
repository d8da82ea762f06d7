"""The cluster's users (docs/auth.md): add, update, remove, list, rotate a token. Every change is a
Raft command (raft/state_users.py), proposed from whichever node received the call; a token is
made here, handed to the caller once, and only its hash enters the log.

Every operation is a cluster-admin one: the front-end checks the caller first (node/api/auth.py).
"""

from __future__ import annotations

from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.transport import auth
from raftlog.node.transport.calls import Call
from raftlog.raft import commands
from raftlog.raft.state_model import MetaState
from raftlog.raft.state_users import reserved_bytes
from raftlog.v1 import auth_pb2


def rules_of(permissions: auth_pb2.Permissions) -> raft_pb2.UserRules:
    return raft_pb2.UserRules(
        publish_allow=permissions.publish_allow, publish_deny=permissions.publish_deny,
        subscribe_allow=permissions.subscribe_allow, subscribe_deny=permissions.subscribe_deny,
        stream_admin=permissions.stream_admin, consumer_admin=permissions.consumer_admin,
        cluster_admin=permissions.cluster_admin)


def permissions_of(rules: raft_pb2.UserRules) -> auth_pb2.Permissions:
    return auth_pb2.Permissions(
        publish_allow=rules.publish_allow, publish_deny=rules.publish_deny,
        subscribe_allow=rules.subscribe_allow, subscribe_deny=rules.subscribe_deny,
        stream_admin=rules.stream_admin, consumer_admin=rules.consumer_admin,
        cluster_admin=rules.cluster_admin)


class UserOps:
    def __init__(self, cluster: ClusterNode, *, clock: Clock) -> None:
        self._cluster = cluster
        self._clock = clock

    async def add(self, request: auth_pb2.AddUserRequest, via: Call) -> auth_pb2.UserToken:
        token, record = auth.new_token(now_ms=self._clock.wall_ms())
        user = record_of(request)
        user.tokens.append(record)
        await self._cluster.propose(commands.user_put(user=user, create=True),
                                    timeout_s=via.remaining_s())
        return auth_pb2.UserToken(name=request.name, token=token,
                                  rocketmq_secret_key=record.hmac_key)

    async def update(self, request: auth_pb2.UpdateUserRequest, via: Call) -> auth_pb2.UserInfo:
        """Replaces the user's permissions, TLS subject and quotas (its tokens stay); the
        nodes apply them to the user's next calls."""
        await self._cluster.propose(commands.user_put(user=record_of(request), create=False),
                                    timeout_s=via.remaining_s())
        with self._cluster.group.read_state() as state:
            user = state.users.get(request.name)
            if user is None:  # removed right after the update
                raise RaftlogError(Reason.USER_NOT_FOUND, f"user {request.name!r} not found")
            return info_of(state, user)

    async def remove(self, request: auth_pb2.RemoveUserRequest, via: Call
                     ) -> auth_pb2.RemoveUserResponse:
        await self._cluster.propose(commands.user_delete(name=request.name),
                                    timeout_s=via.remaining_s())
        return auth_pb2.RemoveUserResponse()

    async def rotate(self, request: auth_pb2.RotateTokenRequest, via: Call
                     ) -> auth_pb2.UserToken:
        if request.revoke_old:
            await self._cluster.propose(commands.user_tokens(
                name=request.name, keep_newest_only=True), timeout_s=via.remaining_s())
            return auth_pb2.UserToken(name=request.name)
        token, record = auth.new_token(now_ms=self._clock.wall_ms())
        await self._cluster.propose(commands.user_tokens(name=request.name, add=[record]),
                                    timeout_s=via.remaining_s())
        return auth_pb2.UserToken(name=request.name, token=token,
                                  rocketmq_secret_key=record.hmac_key)

    async def list(self, request: auth_pb2.ListUsersRequest, via: Call
                   ) -> auth_pb2.ListUsersResponse:
        """From the metadata at the leader's commit (a barrier first), so a user just added
        through another node is listed."""
        await self._cluster.propose(commands.barrier(), timeout_s=via.remaining_s())
        with self._cluster.group.read_state() as state:
            return auth_pb2.ListUsersResponse(users=[
                info_of(state, user) for _, user in sorted(state.users.items())])


def record_of(request: auth_pb2.AddUserRequest | auth_pb2.UpdateUserRequest
              ) -> raft_pb2.UserRecord:
    """The record an add or update stores, tokens aside."""
    return raft_pb2.UserRecord(
        name=request.name, tls_subject=request.tls_subject, rules=rules_of(request.permissions),
        max_msgs_per_s=request.max_msgs_per_s, max_bytes_per_s=request.max_bytes_per_s,
        max_bytes_stored=request.quotas.max_bytes_stored,
        max_connections=request.quotas.max_connections,
        max_subscriptions=request.quotas.max_subscriptions)


def info_of(state: MetaState, user: raft_pb2.UserRecord) -> auth_pb2.UserInfo:
    return auth_pb2.UserInfo(
        name=user.name, permissions=permissions_of(user.rules), tls_subject=user.tls_subject,
        tokens=len(user.tokens), created_ms=user.created_ms, updated_ms=user.updated_ms,
        max_msgs_per_s=user.max_msgs_per_s, max_bytes_per_s=user.max_bytes_per_s,
        quotas=auth_pb2.UserQuotas(max_bytes_stored=user.max_bytes_stored,
                                   max_connections=user.max_connections,
                                   max_subscriptions=user.max_subscriptions),
        bytes_reserved=reserved_bytes(state, user.name))


def require_cluster_admin(*, credential_ok: bool) -> None:
    """A cluster-admin call: the cluster credential, or a user with cluster admin. With auth
    off (no user yet) only the credential will do: the first user is made by the operator."""
    identity = auth.current()
    if credential_ok:
        return
    if identity.rules is None:
        raise RaftlogError(Reason.UNAUTHENTICATED, "managing users needs the cluster "
                           "credential (--secret-file) or a user with cluster admin (--token)")
    identity.require_admin("cluster")
