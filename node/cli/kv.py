"""`raftlog kv ...`: KV buckets (add, info, ls, rm) and their keys (put, get, create, update,
del, purge, touch, keys, history, watch), through the raftlog.v1 KV service.

A value on the command line is UTF-8 text, or `base64:...`; without one, `put`, `create` and
`update` read the value from stdin. `watch` prints every event as it comes (with --json one
JSON document per line) until Ctrl-C, or until --count entries arrived.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from raftlog.base import limits
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    emit,
    group,
    leaf,
    non_negative,
    positive,
    show,
    typed,
    warn,
)
from raftlog.node.cli.client import Client
from raftlog.v1 import kv_pb2, kv_pb2_grpc

_OPERATION_NAMES = {
    kv_pb2.KV_OPERATION_PUT: "PUT",
    kv_pb2.KV_OPERATION_DELETE: "DEL",
    kv_pb2.KV_OPERATION_PURGE: "PURGE",
    kv_pb2.KV_OPERATION_EXPIRED: "EXPIRED",
}


def add_kv_commands(commands: Any) -> None:
    kv = group(commands, "kv", "KV buckets: keys with revisions, TTLs and watches")
    add = leaf(kv, "add", _add, "create a bucket")
    add.add_argument("bucket", metavar="BUCKET")
    add.add_argument("--history", type=non_negative, default=0, metavar="N",
                     help=f"revisions kept per key (default 1, at most {limits.kv_history_max})")
    add.add_argument("--ttl", type=typed(fmt.parse_duration_ms), default=0, metavar="DURATION",
                     help="remove revisions older than this, e.g. 1h (default: kept)")
    add.add_argument("--max-bytes", type=typed(fmt.parse_size), default=0, metavar="SIZE",
                     help="bytes the bucket keeps, e.g. 10MB (default: unlimited)")
    add.add_argument("--max-value-size", type=typed(fmt.parse_size), default=0, metavar="SIZE",
                     help="largest value (default: the node's limit)")
    add.add_argument("--replicas", type=non_negative, default=0, metavar="N",
                     help="copies in a cluster (default 3, capped by the cluster size)")
    add.add_argument("--description", default="", metavar="TEXT")
    _bucket_leaf(kv, "info", _info, "show a bucket's settings and state")
    ls = leaf(kv, "ls", _ls, "list buckets")
    ls.add_argument("--prefix", default="", help="only buckets whose name starts with this")
    _bucket_leaf(kv, "rm", _rm, "delete a bucket with all its keys").add_argument(
        "-f", "--force", action="store_true", help="required: deleting cannot be undone")
    for name, handler, help_text in (
        ("put", _put, "write a value"),
        ("create", _create, "write a value only if the key has none"),
    ):
        _value_arguments(_key_leaf(kv, name, handler, help_text))
    update = _key_leaf(kv, "update", _update, "write a value only if the key is at --revision")
    _value_arguments(update)
    update.add_argument("--revision", type=non_negative, required=True, metavar="N",
                        help="the key's latest revision as you know it (0: never written)")
    get = _key_leaf(kv, "get", _get, "show a key's value")
    get.add_argument("--revision", type=non_negative, default=0, metavar="N",
                     help="the value at this revision instead of the live one")
    get.add_argument("--raw", action="store_true", help="print the value only, as stored")
    delete = _key_leaf(kv, "del", _del, "delete a key (its history stays)")
    delete.add_argument("--revision", type=non_negative, default=None, metavar="N",
                        help="only if the key is at this revision")
    _key_leaf(kv, "purge", _purge, "delete a key and its history")
    touch = _key_leaf(kv, "touch", _touch, "write the value again with a new TTL")
    touch.add_argument("--ttl", type=typed(fmt.parse_duration_ms), default=0,
                       metavar="DURATION", help="the new TTL (default: none)")
    keys = _bucket_leaf(kv, "keys", _keys, "list a bucket's keys")
    keys.add_argument("filter", metavar="PATTERN", nargs="?", default="",
                      help="only keys matching this (wildcards * and >)")
    keys.add_argument("--all", action="store_true", help="also deleted and expired keys")
    keys.add_argument("--limit", type=non_negative, default=0, metavar="N",
                      help=f"at most N (default {limits.list_subjects_limit_default})")
    history = _key_leaf(kv, "history", _history, "list a key's stored revisions")
    history.add_argument("--from-revision", type=non_negative, default=0, metavar="N")
    history.add_argument("--limit", type=non_negative, default=0, metavar="N",
                         help=f"at most N (default {limits.scan_limit_default})")
    watch = _bucket_leaf(kv, "watch", _watch, "print changes as they are written (Ctrl-C "
                         "ends; with --json one document per event, one per line)")
    watch.add_argument("key", metavar="KEY", nargs="?", default="",
                       help="a key or a pattern (default: every key)")
    start = watch.add_mutually_exclusive_group()
    start.add_argument("--history", action="store_true",
                       help="start with every stored revision, not the live values")
    start.add_argument("--updates-only", action="store_true",
                       help="start with nothing: only later changes")
    watch.add_argument("--count", type=positive, default=None, metavar="N",
                       help="end after N entries")


def _bucket_leaf(kv: Any, name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
    parser = leaf(kv, name, handler, help_text)
    parser.add_argument("bucket", metavar="BUCKET")
    return parser


def _key_leaf(kv: Any, name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
    parser = _bucket_leaf(kv, name, handler, help_text)
    parser.add_argument("key", metavar="KEY")
    return parser


def _value_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("value", metavar="VALUE", nargs="?", default=None,
                        help="text, or base64:...; default: read stdin")
    parser.add_argument("--ttl", type=typed(fmt.parse_duration_ms), default=0,
                        metavar="DURATION", help="the value expires after this, e.g. 30s")


def _stub(client: Client) -> Any:
    return kv_pb2_grpc.KVStub(client.channel)  # type: ignore[no-untyped-call]


def _value(args: argparse.Namespace) -> bytes:
    if args.value is not None:
        try:
            return fmt.decode_payload_arg(args.value)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if sys.stdin.isatty():
        raise UsageError("give a VALUE, or pipe it on stdin")
    return sys.stdin.buffer.read()


# ---------------------------------------------------------------------------------------------
# Text.


def bucket_text(info: kv_pb2.KvBucketInfo) -> str:
    config, state = info.config, info.state
    return fmt.render_block(f"Bucket {config.bucket}", [
        ("Description", config.description or "-"),
        ("History", config.history),
        ("TTL", fmt.limit_text(config.max_age_ms, fmt.human_duration_ms)),
        ("Max bytes", fmt.limit_text(config.max_bytes, fmt.human_size)),
        ("Max value size", fmt.limit_text(config.max_value_size, fmt.human_size)),
        ("Replicas", config.replicas),
        ("Keys", fmt.human_count(state.keys)),
        ("Entries", fmt.human_count(state.entries)),
        ("Bytes", fmt.human_size(state.bytes)),
        ("Last revision", state.last_revision),
        ("Stream", info.stream),
    ])


def entry_text(entry: kv_pb2.KvEntry) -> str:
    head = [_OPERATION_NAMES.get(entry.operation, "?"), entry.key, f"rev {entry.revision}",
            fmt.human_time_ms(entry.ts_ms)]
    if entry.expires_ms:
        head.append(f"expires {fmt.human_time_ms(entry.expires_ms)}")
    line = "  ".join(head)
    if entry.operation == kv_pb2.KV_OPERATION_PUT:
        line += "\n  " + "\n  ".join(fmt.payload_text(entry.value).splitlines() or [""])
    return line


def kv_dict(message: Any) -> dict[str, Any]:
    """`fmt.proto_dict`, plus `value_text` beside each entry's value when it is text."""
    document = fmt.proto_dict(message)
    entries: list[tuple[kv_pb2.KvEntry, dict[str, Any]]] = []
    if isinstance(message, kv_pb2.KvEntry):
        entries = [(message, document)]
    elif isinstance(message, kv_pb2.KvHistoryResponse):
        entries = list(zip(message.entries, document["entries"], strict=True))
    elif isinstance(message, kv_pb2.KvWatchEvent) and message.HasField("entry"):
        entries = [(message.entry, document["entry"])]
    for entry, entry_doc in entries:
        text = fmt.payload_text(entry.value)
        if not text.startswith("base64:"):
            entry_doc["value_text"] = text
    return document


def _written_text(verb: str, args: argparse.Namespace, response: kv_pb2.KvWriteResponse) -> str:
    text = f"{verb} {args.bucket} {args.key} at revision {response.revision}"
    if response.expires_ms:
        text += f", expires {fmt.human_time_ms(response.expires_ms)}"
    return text


# ---------------------------------------------------------------------------------------------
# Buckets.


async def _add(client: Client, args: argparse.Namespace) -> int:
    config = kv_pb2.KvBucketConfig(
        bucket=args.bucket, history=args.history, max_age_ms=args.ttl, max_bytes=args.max_bytes,
        max_value_size=args.max_value_size, replicas=args.replicas, description=args.description)
    info = await _stub(client).CreateBucket(kv_pb2.KvCreateBucketRequest(config=config),
                                            timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: bucket_text(info))
    return EXIT_OK


async def _info(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).GetBucketInfo(kv_pb2.KvGetBucketInfoRequest(bucket=args.bucket),
                                             timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: bucket_text(info))
    return EXIT_OK


async def _ls(client: Client, args: argparse.Namespace) -> int:
    response = await _stub(client).ListBuckets(kv_pb2.KvListBucketsRequest(prefix=args.prefix),
                                               timeout=client.deadline_s())

    def text() -> str:
        if not response.buckets:
            return "no buckets"
        return fmt.render_table(
            ["BUCKET", "KEYS", "ENTRIES", "BYTES", "HISTORY", "TTL"],
            [(b.config.bucket, b.state.keys, b.state.entries, fmt.human_size(b.state.bytes),
              b.config.history, fmt.limit_text(b.config.max_age_ms, fmt.human_duration_ms))
             for b in response.buckets], right_align=(1, 2, 4))

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


async def _rm(client: Client, args: argparse.Namespace) -> int:
    if not args.force:
        warn(f"error: refusing to delete bucket {args.bucket!r} without --force")
        return EXIT_USAGE
    await _stub(client).DeleteBucket(kv_pb2.KvDeleteBucketRequest(bucket=args.bucket),
                                     timeout=client.deadline_s())
    emit(args, {"deleted": args.bucket}, lambda: f"deleted bucket {args.bucket}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Keys.


async def _put(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvPutRequest(bucket=args.bucket, key=args.key, value=_value(args),
                                  ttl_ms=args.ttl)
    response = await _stub(client).Put(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: _written_text("put", args, response))
    return EXIT_OK


async def _create(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvCreateRequest(bucket=args.bucket, key=args.key, value=_value(args),
                                     ttl_ms=args.ttl)
    response = await _stub(client).Create(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: _written_text("created", args, response))
    return EXIT_OK


async def _update(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvUpdateRequest(bucket=args.bucket, key=args.key, value=_value(args),
                                     revision=args.revision, ttl_ms=args.ttl)
    response = await _stub(client).Update(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: _written_text("updated", args, response))
    return EXIT_OK


async def _get(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvGetRequest(bucket=args.bucket, key=args.key, revision=args.revision)
    entry = await _stub(client).Get(request, timeout=client.deadline_s())
    if args.raw and not args.json:
        sys.stdout.buffer.write(entry.value)
        sys.stdout.flush()
        return EXIT_OK
    emit(args, kv_dict(entry), lambda: entry_text(entry))
    return EXIT_OK


async def _del(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvDeleteRequest(bucket=args.bucket, key=args.key)
    if args.revision is not None:
        request.revision = args.revision
    response = await _stub(client).Delete(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: _written_text("deleted", args, response))
    return EXIT_OK


async def _purge(client: Client, args: argparse.Namespace) -> int:
    response = await _stub(client).Purge(kv_pb2.KvPurgeRequest(bucket=args.bucket,
                                                               key=args.key),
                                         timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response),
         lambda: f"purged {args.bucket} {args.key}: marker at revision {response.revision}, "
         f"{response.purged} earlier revisions removed")
    return EXIT_OK


async def _touch(client: Client, args: argparse.Namespace) -> int:
    response = await _stub(client).Touch(kv_pb2.KvTouchRequest(
        bucket=args.bucket, key=args.key, ttl_ms=args.ttl), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: _written_text("touched", args, response))
    return EXIT_OK


async def _keys(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvKeysRequest(bucket=args.bucket, filter=args.filter, limit=args.limit,
                                   include_deleted=args.all)
    response = await _stub(client).Keys(request, timeout=client.deadline_s())

    def text() -> str:
        if not response.keys:
            return "no keys"
        lines = [f"{k.key}{'  (deleted)' if k.deleted else ''}" for k in response.keys]
        if response.truncated:
            lines.append("(more keys match: raise --limit or narrow the pattern)")
        return "\n".join(lines)

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


async def _history(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvHistoryRequest(bucket=args.bucket, key=args.key,
                                      from_revision=args.from_revision, limit=args.limit)
    response = await _stub(client).History(request, timeout=client.deadline_s())

    def text() -> str:
        lines = [entry_text(entry) for entry in response.entries]
        if response.next_revision:
            lines.append(f"(more: --from-revision {response.next_revision})")
        return "\n".join(lines)

    emit(args, kv_dict(response), text)
    return EXIT_OK


async def _watch(client: Client, args: argparse.Namespace) -> int:
    request = kv_pb2.KvWatchRequest(bucket=args.bucket, key=args.key,
                                    include_history=args.history,
                                    updates_only=args.updates_only)
    call = _stub(client).Watch(request)  # no deadline: it runs until stopped
    entries = 0
    try:
        async for event in call:
            if args.json:
                show(json.dumps(kv_dict(event), ensure_ascii=False))
            elif event.HasField("caught_up"):
                show(f"-- up to date at revision {event.caught_up.revision}")
            else:
                show(entry_text(event.entry))
            entries += event.HasField("entry")
            if args.count is not None and entries >= args.count:
                break
    finally:
        call.cancel()
    return EXIT_OK
