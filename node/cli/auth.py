"""`raftlog auth`: the cluster's users (docs/auth.md).

    raftlog auth user add NAME [--publish PAT ...] [--subscribe PAT ...] [--deny-publish PAT ...]
                               [--deny-subscribe PAT ...] [--admin streams,consumers,cluster]
                               [--tls-subject CN] [--max-msgs-per-s N]
                               [--max-bytes-per-s SIZE] [--max-bytes-stored SIZE]
                               [--max-connections N] [--max-subscriptions N]
    raftlog auth user update NAME [the flags of add]   (what is not given stays as it is)
    raftlog auth user rm NAME
    raftlog auth user ls [--json]
    raftlog auth token rotate NAME [--revoke-old]

Each is a cluster-admin call: the cluster secret (--secret-file) or the token of a user with
cluster admin (--token). A new token is printed once; the cluster keeps only its hash.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import EXIT_OK, emit, group, leaf, non_negative, typed
from raftlog.node.cli.client import Client
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER
from raftlog.v1 import auth_pb2, auth_pb2_grpc

AUTH_SERVICE = auth_pb2.DESCRIPTOR.services_by_name["Auth"].full_name
ADMIN_KINDS = ("streams", "consumers", "cluster")


def admin_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in ADMIN_KINDS]
    if unknown:
        raise ValueError(f"unknown admin kind(s) {unknown}: use {','.join(ADMIN_KINDS)}")
    return kinds


def add_auth_commands(commands: Any) -> None:
    auth = group(commands, "auth", "users, their tokens and permissions (docs/auth.md)")
    user = group(auth, "user", "add, remove and list users")
    add = leaf(user, "add", _user_add, "add a user and print its first token (shown once)")
    add.add_argument("name", metavar="NAME")
    _user_flags(add, unset=False)
    update = leaf(user, "update", _user_update,
                  "change a user's permissions and quotas (flags not given stay as they are)")
    update.add_argument("name", metavar="NAME")
    _user_flags(update, unset=True)
    leaf(user, "rm", _user_rm, "remove a user and its tokens").add_argument(
        "name", metavar="NAME")
    leaf(user, "ls", _user_ls, "list users (never a token)")
    token = group(auth, "token", "rotate a user's token")
    rotate = leaf(token, "rotate", _token_rotate,
                  "add a new token (the old ones keep working until --revoke-old)")
    rotate.add_argument("name", metavar="NAME")
    rotate.add_argument("--revoke-old", action="store_true",
                        help="drop every token of the user but the newest; makes none")


def _user_flags(parser: Any, *, unset: bool) -> None:
    """The flags of `user add` (defaults: none, no quota) and `user update` (defaults: None,
    meaning "keep")."""
    def default(value: Any) -> Any:
        return None if unset else value

    for flag, help_text in (("--publish", "subjects it may publish to"),
                            ("--subscribe", "subjects it may read (fetch, subscribe, get)"),
                            ("--deny-publish", "subjects it may never publish to"),
                            ("--deny-subscribe", "subjects it may never read")):
        parser.add_argument(flag, nargs="*" if unset else "+", action="extend",
                            default=default([]), metavar="PATTERN",
                            help=f"{help_text}: NATS patterns (`*`, `>`); deny wins"
                                 + ("; given without a pattern, none" if unset else ""))
    parser.add_argument("--admin", type=typed(admin_kinds), default=default(()),
                        metavar="KINDS", help="what it may administer: streams,consumers,"
                                              "cluster" + (" ('' = nothing)" if unset else ""))
    parser.add_argument("--tls-subject", default=default(""), metavar="CN",
                        help="a client certificate common name that authenticates as this user")
    parser.add_argument("--max-msgs-per-s", type=non_negative, default=default(0), metavar="N",
                        help="publish quota: at most N messages a second through each node it "
                             "calls (docs/quotas.md); 0 = none")
    parser.add_argument("--max-bytes-per-s", type=typed(fmt.parse_size), default=default(0),
                        metavar="SIZE", help="publish quota: at most this many bytes a second "
                                             "through each node it calls, e.g. 1MB; 0 = none")
    parser.add_argument("--max-bytes-stored", type=typed(fmt.parse_size), default=default(0),
                        metavar="SIZE", help="storage quota: the max_bytes of the streams it "
                                             "creates add up to at most this; 0 = none")
    parser.add_argument("--max-connections", type=non_negative, default=default(0),
                        metavar="N", help="client connections with its calls open on one node "
                                          "at once; 0 = none")
    parser.add_argument("--max-subscriptions", type=non_negative, default=default(0),
                        metavar="N", help="subscriptions it holds open on one node at once; "
                                          "0 = none")


def _stub(client: Client) -> Any:
    return auth_pb2_grpc.AuthStub(client.channel)  # type: ignore[no-untyped-call]


def _admin(client: Client, method: str) -> tuple[tuple[str, str], ...]:
    """The cluster credential's token for one Auth call, when the CLI has the secret."""
    if client.credential is None:
        return ()
    path = f"/{AUTH_SERVICE}/{method}"
    return ((ADMIN_TOKEN_HEADER, client.credential.token(principal="admin", method=path)),)


def _show_token(args: argparse.Namespace, answer: auth_pb2.UserToken, verb: str) -> int:
    def text() -> str:
        if not answer.token:
            return f"user {answer.name}: every token but the newest revoked"
        return (f"user {answer.name} {verb}; its token (shown once, keep it secret):\n"
                f"{answer.token}\n"
                f"RocketMQ clients: access key {answer.name}, secret key "
                f"{answer.rocketmq_secret_key}")

    emit(args, fmt.proto_dict(answer), text)
    return EXIT_OK


async def _user_add(client: Client, args: argparse.Namespace) -> int:
    request = auth_pb2.AddUserRequest(name=args.name)
    _apply_flags(request, args)
    answer = await _stub(client).AddUser(request, timeout=client.deadline_s(),
                                         metadata=_admin(client, "AddUser"))
    return _show_token(args, answer, "added")


async def _user_update(client: Client, args: argparse.Namespace) -> int:
    listing = await _stub(client).ListUsers(auth_pb2.ListUsersRequest(),
                                            timeout=client.deadline_s(),
                                            metadata=_admin(client, "ListUsers"))
    current = next((user for user in listing.users if user.name == args.name), None)
    if current is None:  # the server says so in its own words
        current = auth_pb2.UserInfo(name=args.name)
    request = auth_pb2.UpdateUserRequest(
        name=args.name, permissions=current.permissions, tls_subject=current.tls_subject,
        max_msgs_per_s=current.max_msgs_per_s, max_bytes_per_s=current.max_bytes_per_s,
        quotas=current.quotas)
    _apply_flags(request, args)
    answer = await _stub(client).UpdateUser(request, timeout=client.deadline_s(),
                                            metadata=_admin(client, "UpdateUser"))
    emit(args, fmt.proto_dict(answer), lambda: f"user updated: {_user_line(answer)}")
    return EXIT_OK


def _apply_flags(request: auth_pb2.AddUserRequest | auth_pb2.UpdateUserRequest,
                 args: argparse.Namespace) -> None:
    """Sets what the flags give (a None flag leaves the request's value)."""
    rules = request.permissions
    for flag, field in (("publish", "publish_allow"), ("deny_publish", "publish_deny"),
                        ("subscribe", "subscribe_allow"), ("deny_subscribe", "subscribe_deny")):
        patterns = getattr(args, flag)
        if patterns is not None:
            del getattr(rules, field)[:]
            getattr(rules, field).extend(patterns)
    if args.admin is not None:
        rules.stream_admin = "streams" in args.admin
        rules.consumer_admin = "consumers" in args.admin
        rules.cluster_admin = "cluster" in args.admin
    for flag, target, field in (("tls_subject", request, "tls_subject"),
                                ("max_msgs_per_s", request, "max_msgs_per_s"),
                                ("max_bytes_per_s", request, "max_bytes_per_s"),
                                ("max_bytes_stored", request.quotas, "max_bytes_stored"),
                                ("max_connections", request.quotas, "max_connections"),
                                ("max_subscriptions", request.quotas, "max_subscriptions")):
        value = getattr(args, flag)
        if value is not None:
            setattr(target, field, value)


async def _user_rm(client: Client, args: argparse.Namespace) -> int:
    await _stub(client).RemoveUser(auth_pb2.RemoveUserRequest(name=args.name),
                                   timeout=client.deadline_s(),
                                   metadata=_admin(client, "RemoveUser"))
    emit(args, {"removed": args.name}, lambda: f"user {args.name} removed")
    return EXIT_OK


async def _user_ls(client: Client, args: argparse.Namespace) -> int:
    answer = await _stub(client).ListUsers(auth_pb2.ListUsersRequest(),
                                           timeout=client.deadline_s(),
                                           metadata=_admin(client, "ListUsers"))

    def text() -> str:
        if not answer.users:
            return "no users: authentication is off"
        return "\n".join(_user_line(user) for user in answer.users)

    emit(args, fmt.proto_dict(answer), text)
    return EXIT_OK


def _user_line(user: auth_pb2.UserInfo) -> str:
    rules = user.permissions
    admin = [kind for kind, allowed in zip(ADMIN_KINDS, (
        rules.stream_admin, rules.consumer_admin, rules.cluster_admin), strict=True) if allowed]
    parts = [f"{user.name}: {user.tokens} token(s)",
             f"publish {list(rules.publish_allow)} deny {list(rules.publish_deny)}",
             f"subscribe {list(rules.subscribe_allow)} deny {list(rules.subscribe_deny)}",
             f"admin {','.join(admin) or '-'}"]
    if user.tls_subject:
        parts.append(f"tls subject {user.tls_subject!r}")
    if user.max_msgs_per_s or user.max_bytes_per_s:
        parts.append(f"publish rate {user.max_msgs_per_s or '-'} msgs/s, "
                     f"{user.max_bytes_per_s or '-'} bytes/s per node")
    quotas = user.quotas
    if quotas.max_bytes_stored:
        parts.append(f"stores {user.bytes_reserved} of {quotas.max_bytes_stored} bytes")
    if quotas.max_connections or quotas.max_subscriptions:
        parts.append(f"at once per node: {quotas.max_connections or '-'} connections, "
                     f"{quotas.max_subscriptions or '-'} subscriptions")
    return "; ".join(parts)


async def _token_rotate(client: Client, args: argparse.Namespace) -> int:
    answer = await _stub(client).RotateToken(
        auth_pb2.RotateTokenRequest(name=args.name, revoke_old=args.revoke_old),
        timeout=client.deadline_s(), metadata=_admin(client, "RotateToken"))
    return _show_token(args, answer, "has a new token")
