"""The raftlog.v1 `Auth` service: the cluster's users (docs/auth.md), each call handed to
node/ops/users.py once the caller proved it is a cluster admin: the cluster credential (an
admin token for the method, as on the Cluster service) or a user with cluster admin."""

from __future__ import annotations

from typing import Any

import grpc

from raftlog.base.errors import RaftlogError
from raftlog.node.ops.users import UserOps, require_cluster_admin
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.v1 import auth_pb2, auth_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
_SERVICE_PREFIX = "/" + auth_pb2.DESCRIPTOR.services_by_name["Auth"].full_name + "/"


class AuthService(auth_pb2_grpc.AuthServicer):
    def __init__(self, users: UserOps, credential: Credential) -> None:
        self._users = users
        self._credential = credential

    def _admit(self, context: Context, method: str) -> Call:
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == ADMIN_TOKEN_HEADER:
                token = value if isinstance(value, str) else bytes(value).decode("replace")
        credential_ok = False
        if token:
            try:
                self._credential.verify(token, method=f"{_SERVICE_PREFIX}{method}")
                credential_ok = True
            except RaftlogError:
                credential_ok = False
        require_cluster_admin(credential_ok=credential_ok)
        return Call.from_grpc(context)

    @rpc.unary
    async def AddUser(self, request: auth_pb2.AddUserRequest, context: Context
                      ) -> auth_pb2.UserToken:
        return await self._users.add(request, self._admit(context, "AddUser"))

    @rpc.unary
    async def RemoveUser(self, request: auth_pb2.RemoveUserRequest, context: Context
                         ) -> auth_pb2.RemoveUserResponse:
        return await self._users.remove(request, self._admit(context, "RemoveUser"))

    @rpc.unary
    async def ListUsers(self, request: auth_pb2.ListUsersRequest, context: Context
                        ) -> auth_pb2.ListUsersResponse:
        return await self._users.list(request, self._admit(context, "ListUsers"))

    @rpc.unary
    async def RotateToken(self, request: auth_pb2.RotateTokenRequest, context: Context
                          ) -> auth_pb2.UserToken:
        return await self._users.rotate(request, self._admit(context, "RotateToken"))

    @rpc.unary
    async def UpdateUser(self, request: auth_pb2.UpdateUserRequest, context: Context
                         ) -> auth_pb2.UserInfo:
        return await self._users.update(request, self._admit(context, "UpdateUser"))


def admin_metadata(credential: Credential, method: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authorizes one call of `method` (e.g. "AddUser") with the cluster
    credential."""
    path = f"{_SERVICE_PREFIX}{method}"
    return ((ADMIN_TOKEN_HEADER, credential.token(principal="admin", method=path)),)
