"""`raftlog hash ...`, `raftlog set ...`, `raftlog queue ...`: the collections (raftlog.v1
Collections) from the command line.

Each kind has `create`, `rm`, `info` and `ls`; then
  hash  set|get|exists|del|getall|fields|len     NAME KEY [FIELD [VALUE]]
  set   add|remove|ismember|members|len          NAME KEY [MEMBER]
  queue push|pop|peek|len                        NAME [VALUE...]
A value is UTF-8 text, or `base64:...` for bytes. With --json a value comes as the proto's
base64 `value` plus `value_text` when it is text. Exit status as every command: 1 when the node
refused (`error: FIELD_NOT_FOUND: ...`, `error: QUEUE_EMPTY: ...`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_OK,
    UsageError,
    emit,
    group,
    leaf,
    non_negative,
    seconds,
    typed,
)
from raftlog.node.cli.client import Client
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import collections_pb2_grpc

KINDS = {"hash": pb.COLLECTION_KIND_HASH, "set": pb.COLLECTION_KIND_SET,
         "queue": pb.COLLECTION_KIND_QUEUE}
KIND_WORDS = {value: word for word, value in KINDS.items()}


def add_collection_commands(commands: Any) -> None:
    for word, add_actions, help_text in (
            ("hash", _add_hash, "hashes: keys of fields with values (set, get, del, getall...)"),
            ("set", _add_set, "sets: keys of distinct members (add, remove, ismember...)"),
            ("queue", _add_queue, "queues: values popped in order, each by one caller")):
        actions = group(commands, word, help_text)
        _add_lifecycle(actions, word)
        add_actions(actions)


def _stub(client: Client) -> Any:
    return collections_pb2_grpc.CollectionsStub(client.channel)  # type: ignore[no-untyped-call]


def _value_doc(message: Any) -> dict[str, Any]:
    """The proto as JSON, with `value_text` beside every `value` that is text."""
    document = fmt.proto_dict(message)

    def add(item: Any, doc: dict[str, Any]) -> None:
        text = fmt.payload_text(item.value)
        if not text.startswith("base64:"):
            doc["value_text"] = text

    if hasattr(message, "value"):
        add(message, document)
    for name in ("entries", "items"):
        for item, doc in zip(getattr(message, name, ()), document.get(name, ()), strict=True):
            add(item, doc)
    return document


def _value(text: str) -> bytes:
    try:
        return fmt.decode_payload_arg(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _action(actions: Any, kind: str, name: str, run: Callable[..., Any], help_text: str,
            *positionals: str) -> argparse.ArgumentParser:
    parser = leaf(actions, name, run, help_text)
    parser.set_defaults(kind=KINDS[kind])
    for positional in positionals:
        parser.add_argument(positional.lower(), metavar=positional)
    return parser


# ---------------------------------------------------------------------------------- lifecycle


def _add_lifecycle(actions: Any, kind: str) -> None:
    create = _action(actions, kind, "create", _create, f"create a {kind}", "NAME")
    create.add_argument("--max-bytes", type=typed(fmt.parse_size), default=0, metavar="SIZE",
                        help="refuse writes past this size (e.g. 64MiB; default: no limit)")
    if kind == "queue":
        create.add_argument("--max-messages", type=non_negative, default=0, metavar="N",
                            help="refuse pushes past N waiting values (default: no limit)")
    create.add_argument("--ephemeral", action="store_true",
                        help="recorded; the contents are stored durably all the same")
    _action(actions, kind, "rm", _delete, f"delete a {kind} and everything in it", "NAME")
    _action(actions, kind, "info", _info, f"show a {kind}'s settings and size", "NAME")
    _action(actions, kind, "ls", _list, f"list the {kind} collections")


def _info_text(info: pb.CollectionInfo) -> str:
    return fmt.render_block(f"{KIND_WORDS[info.kind]} {info.name}", [
        ("stream", info.stream),
        ("max bytes", fmt.limit_text(info.max_bytes, fmt.human_size)),
        *([("max messages", fmt.limit_text(info.max_messages))]
          if info.kind == pb.COLLECTION_KIND_QUEUE else []),
        ("ephemeral", f"{'yes' if info.ephemeral else 'no'} (stored durably)"),
        ("size", f"{fmt.human_size(info.bytes)} in {fmt.human_count(info.messages)} messages"),
        ("created", fmt.human_time_ms(info.created_ms)),
    ])


async def _create(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).CreateCollection(pb.CreateCollectionRequest(
        kind=args.kind, name=args.name, max_bytes=args.max_bytes,
        max_messages=getattr(args, "max_messages", 0), ephemeral=args.ephemeral),
        timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: _info_text(info))
    return EXIT_OK


async def _delete(client: Client, args: argparse.Namespace) -> int:
    await _stub(client).DeleteCollection(pb.DeleteCollectionRequest(
        kind=args.kind, name=args.name), timeout=client.deadline_s())
    word = KIND_WORDS[args.kind]
    emit(args, {"deleted": args.name, "kind": word}, lambda: f"deleted {word} {args.name}")
    return EXIT_OK


async def _info(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).GetCollectionInfo(pb.GetCollectionInfoRequest(
        kind=args.kind, name=args.name), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: _info_text(info))
    return EXIT_OK


async def _list(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListCollections(pb.ListCollectionsRequest(kind=args.kind),
                                                timeout=client.deadline_s())

    def text() -> str:
        if not reply.collections:
            return f"no {KIND_WORDS[args.kind]} collections"
        return fmt.render_table(["NAME", "BYTES", "MESSAGES", "MAX BYTES"], [
            (c.name, fmt.human_size(c.bytes), fmt.human_count(c.messages),
             fmt.limit_text(c.max_bytes, fmt.human_size)) for c in reply.collections],
            right_align=(1, 2, 3))

    emit(args, fmt.proto_dict(reply), text)
    return EXIT_OK


# --------------------------------------------------------------------------------------- hash


def _add_hash(actions: Any) -> None:
    _action(actions, "hash", "set", _hash_set, "set a field's value", "NAME", "KEY", "FIELD",
            "VALUE")
    _action(actions, "hash", "get", _hash_get, "show a field's value", "NAME", "KEY", "FIELD")
    _action(actions, "hash", "exists", _hash_exists, "does the field have a value?", "NAME",
            "KEY", "FIELD")
    _action(actions, "hash", "del", _hash_del, "delete a field", "NAME", "KEY", "FIELD")
    for name, run, help_text in (("getall", _hash_getall, "every field of a key with its value"),
                                 ("fields", _hash_fields, "every field name of a key")):
        _action(actions, "hash", name, run, help_text, "NAME", "KEY").add_argument(
            "--limit", type=non_negative, default=0, metavar="N",
            help="at most N fields (default 1000)")
    _action(actions, "hash", "len", _hash_len, "how many fields a key has", "NAME", "KEY")


def _field(args: argparse.Namespace) -> pb.HashFieldRequest:
    return pb.HashFieldRequest(collection=args.name, key=args.key, field=args.field)


async def _hash_set(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).SetHashField(pb.SetHashFieldRequest(
        collection=args.name, key=args.key, field=args.field,
        value=_value(args.value)), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: f"revision {reply.revision}")
    return EXIT_OK


async def _hash_get(client: Client, args: argparse.Namespace) -> int:
    entry = await _stub(client).GetHashField(_field(args), timeout=client.deadline_s())
    emit(args, _value_doc(entry), lambda: fmt.payload_text(entry.value))
    return EXIT_OK


async def _hash_exists(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).HashFieldExists(_field(args), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "yes" if reply.exists else "no")
    return EXIT_OK


async def _hash_del(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).DeleteHashField(_field(args), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply),
         lambda: "deleted" if reply.deleted else "no such field (nothing deleted)")
    return EXIT_OK


async def _hash_getall(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).GetHash(pb.HashKeyRequest(
        collection=args.name, key=args.key, limit=args.limit), timeout=client.deadline_s())

    def text() -> str:
        lines = [f"{e.field}\t{fmt.payload_text(e.value)}" for e in reply.entries]
        return "\n".join(lines + (["(more fields: raise --limit)"] if reply.truncated else [])) \
            or "no fields"

    emit(args, _value_doc(reply), text)
    return EXIT_OK


async def _hash_fields(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListHashFields(pb.HashKeyRequest(
        collection=args.name, key=args.key, limit=args.limit), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "\n".join(reply.fields) or "no fields")
    return EXIT_OK


async def _hash_len(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).CountHashFields(pb.HashKeyRequest(
        collection=args.name, key=args.key), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: str(reply.count))
    return EXIT_OK


# ---------------------------------------------------------------------------------------- set


def _add_set(actions: Any) -> None:
    _action(actions, "set", "add", _set_add, "add a member", "NAME", "KEY", "MEMBER")
    _action(actions, "set", "remove", _set_remove, "remove a member", "NAME", "KEY", "MEMBER")
    _action(actions, "set", "ismember", _set_is_member, "is it a member?", "NAME", "KEY",
            "MEMBER")
    _action(actions, "set", "members", _set_members, "every member of a key", "NAME",
            "KEY").add_argument("--limit", type=non_negative, default=0, metavar="N",
                                help="at most N members (default 1000)")
    _action(actions, "set", "len", _set_len, "how many members a key has", "NAME", "KEY")


def _member(args: argparse.Namespace) -> pb.SetMemberRequest:
    return pb.SetMemberRequest(collection=args.name, key=args.key, member=args.member)


async def _set_add(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).AddSetMember(_member(args), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "added" if reply.added else "already a member")
    return EXIT_OK


async def _set_remove(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).RemoveSetMember(_member(args), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "removed" if reply.removed else "not a member")
    return EXIT_OK


async def _set_is_member(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).IsSetMember(_member(args), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "yes" if reply.is_member else "no")
    return EXIT_OK


async def _set_members(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListSetMembers(pb.SetKeyRequest(
        collection=args.name, key=args.key, limit=args.limit), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "\n".join(reply.members) or "no members")
    return EXIT_OK


async def _set_len(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).CountSetMembers(pb.SetKeyRequest(
        collection=args.name, key=args.key), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: str(reply.count))
    return EXIT_OK


# -------------------------------------------------------------------------------------- queue


def _add_queue(actions: Any) -> None:
    push = _action(actions, "queue", "push", _queue_push, "push values (one per argument)",
                   "NAME")
    push.add_argument("values", nargs="+", metavar="VALUE")
    pop = _action(actions, "queue", "pop", _queue_pop, "pop the oldest value", "NAME")
    pop.add_argument("--wait", type=typed(seconds), default=0.0, metavar="DURATION",
                     help="wait this long for a value when the queue is empty (default: 0)")
    peek = _action(actions, "queue", "peek", _queue_peek, "show waiting values, not popping",
                   "NAME")
    peek.add_argument("--from", dest="from_sequence", type=non_negative, default=0,
                      metavar="SEQ", help="first sequence (default: the oldest waiting)")
    peek.add_argument("--limit", type=non_negative, default=0, metavar="N",
                      help="at most N values (default 100)")
    _action(actions, "queue", "len", _queue_len, "how many values wait", "NAME")


async def _queue_push(client: Client, args: argparse.Namespace) -> int:
    """One push per value, in order; a refused one stops the rest, after saying what was
    pushed."""
    values = [_value(text) for text in args.values]
    sequences: list[int] = []
    try:
        for value in values:
            reply = await _stub(client).PushQueue(pb.PushQueueRequest(
                collection=args.name, value=value), timeout=client.deadline_s())
            sequences.append(reply.sequence)
    finally:
        emit(args, {"sequences": sequences},
             lambda: "\n".join(f"pushed at sequence {s}" for s in sequences) or "pushed none")
    return EXIT_OK


async def _queue_pop(client: Client, args: argparse.Namespace) -> int:
    item = await _stub(client).PopQueue(pb.PopQueueRequest(
        collection=args.name, max_wait_ms=int(args.wait * 1000)),
        timeout=client.deadline_s(extra_s=args.wait))
    emit(args, _value_doc(item), lambda: fmt.payload_text(item.value))
    return EXIT_OK


async def _queue_peek(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).PeekQueue(pb.PeekQueueRequest(
        collection=args.name, from_sequence=args.from_sequence, limit=args.limit),
        timeout=client.deadline_s())

    def text() -> str:
        lines = [f"{item.sequence}\t{fmt.payload_text(item.value)}" for item in reply.items]
        if reply.next_sequence:
            lines.append(f"(more from sequence {reply.next_sequence})")
        return "\n".join(lines) or "empty"

    emit(args, _value_doc(reply), text)
    return EXIT_OK


async def _queue_len(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).CountQueue(pb.CountQueueRequest(collection=args.name),
                                           timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: str(reply.count))
    return EXIT_OK
