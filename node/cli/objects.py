"""`raftlog obj ...`: object buckets (add, buckets, rm-bucket) and their objects (put, get, info,
ls, rm, revisions), through the raftlog.v1 Objects service.

`put` and `get` stream the file in chunks (PutStream, GetStream), so a file of any size moves
with memory bounded by the chunk size; both hash it on the way (put sends the SHA-256 in its
finish frame, get checks it) and draw a progress bar on stderr when it is a terminal (or with
--progress). A transfer's deadline grows with its size: --timeout plus one second per MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from raftlog.base import limits
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    emit,
    group,
    leaf,
    non_negative,
    typed,
    warn,
)
from raftlog.node.cli.client import Client
from raftlog.v1 import objects_pb2, objects_pb2_grpc, types_pb2

transfer_bytes_per_s_min = 1024 * 1024  # a transfer's deadline allows at least this rate
progress_period_s = 0.2  # the progress bar is redrawn at most this often
progress_width = 30  # characters of the bar


def add_object_commands(commands: Any) -> None:
    obj = group(commands, "obj", "object buckets: files of any size, chunked and hashed")
    add = leaf(obj, "add", _add, "create a bucket")
    add.add_argument("bucket", metavar="BUCKET")
    add.add_argument("--replicas", type=non_negative, default=0, metavar="N",
                     help="copies in a cluster (default 3, capped by the cluster size)")
    add.add_argument("--description", default="", metavar="TEXT")
    leaf(obj, "buckets", _buckets, "list buckets")
    rm_bucket = leaf(obj, "rm-bucket", _rm_bucket, "delete a bucket with all its objects")
    rm_bucket.add_argument("bucket", metavar="BUCKET")
    rm_bucket.add_argument("-f", "--force", action="store_true",
                           help="required: deleting cannot be undone")
    put = leaf(obj, "put", _put, "store a file (or stdin with FILE -) as an object")
    put.add_argument("bucket", metavar="BUCKET")
    put.add_argument("file", metavar="FILE", help="the file to store; - reads stdin")
    put.add_argument("--name", default="", metavar="NAME",
                     help="the object's name (default: the file's name)")
    default_chunk = fmt.human_size(limits.object_chunk_bytes_default)
    put.add_argument("--chunk-size", type=typed(fmt.parse_size), default=0, metavar="SIZE",
                     help=f"bytes per chunk (default {default_chunk}, at most "
                     f"{limits.object_chunk_bytes_max} bytes)")
    put.add_argument("-H", "--header", action="append", default=[], type=typed(fmt.parse_header),
                     metavar="KEY=VALUE", help="a header kept with the object (repeatable)")
    _progress_option(put)
    get = _object_leaf(obj, "get", _get, "write an object to a file (or stdout)")
    get.add_argument("-o", "--output", default="", metavar="FILE",
                     help="where to write it (default: the object's name in the current "
                     "directory; - writes stdout)")
    _progress_option(get)
    _object_leaf(obj, "info", _info, "show an object's size, hash and revision")
    ls = leaf(obj, "ls", _ls, "list a bucket's objects")
    ls.add_argument("bucket", metavar="BUCKET")
    ls.add_argument("--prefix", default="", help="only names starting with this")
    ls.add_argument("--all", action="store_true", help="also deleted objects")
    ls.add_argument("--limit", type=non_negative, default=0, metavar="N",
                    help=f"at most N (default {limits.object_list_limit_default})")
    _object_leaf(obj, "rm", _rm, "delete an object (its revisions stay listed)")
    revisions = _object_leaf(obj, "revisions", _revisions, "list an object's revisions")
    revisions.add_argument("--from-revision", type=non_negative, default=0, metavar="N")
    revisions.add_argument("--limit", type=non_negative, default=0, metavar="N",
                           help=f"at most N (default {limits.object_revisions_limit_default})")


def _object_leaf(obj: Any, name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
    parser = leaf(obj, name, handler, help_text)
    parser.add_argument("bucket", metavar="BUCKET")
    parser.add_argument("name", metavar="NAME")
    return parser


def _progress_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="draw a progress bar on stderr (default: when it is a terminal)")


def _stub(client: Client) -> Any:
    return objects_pb2_grpc.ObjectsStub(client.channel)  # type: ignore[no-untyped-call]


def _transfer_deadline_s(client: Client, size: int) -> float | None:
    base = client.deadline_s()
    return None if base is None else base + size / transfer_bytes_per_s_min


# ---------------------------------------------------------------------------------------------
# Text.


class Progress:
    """A one-line bar on stderr: `name [#####.....]  42%  12.0 MiB / 28.6 MiB  9.8 MiB/s`."""

    def __init__(self, label: str, total: int, *, shown: bool) -> None:
        self._label = label
        self._total = total
        self._shown = shown
        self._done = 0
        self._started = time.monotonic()
        self._drawn = 0.0

    def add(self, count: int) -> None:
        self._done += count
        if self._shown and time.monotonic() - self._drawn >= progress_period_s:
            self._draw()

    def finish(self) -> None:
        if self._shown:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self) -> None:
        self._drawn = time.monotonic()
        fraction = self._done / self._total if self._total else 1.0
        filled = int(fraction * progress_width)
        rate = self._done / max(self._drawn - self._started, 1e-6)
        sys.stderr.write(f"\r{self._label} [{'#' * filled}{'.' * (progress_width - filled)}] "
                         f"{fraction * 100:3.0f}%  {fmt.human_size(self._done)} / "
                         f"{fmt.human_size(self._total)}  {fmt.human_size(int(rate))}/s ")
        sys.stderr.flush()


def _shown(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


def object_text(info: objects_pb2.ObjectInfo) -> str:
    return fmt.render_block(f"Object {info.bucket}/{info.name}", [
        ("Size", f"{fmt.human_size(info.size)} ({info.size} bytes)"),
        ("SHA-256", info.sha256 or "-"),
        ("Chunks", f"{info.chunk_count} of {fmt.human_size(info.chunk_size)}"),
        ("Revision", info.revision),
        ("Stored", fmt.human_time_ms(info.ts_ms)),
        ("Deleted", "yes" if info.deleted else "no"),
        *((f"Header {h.key}", h.value) for h in info.headers),
    ])


def _objects_table(objects: Any) -> str:
    return fmt.render_table(
        ["NAME", "SIZE", "REVISION", "STORED", "SHA-256"],
        [[o.name + (" (deleted)" if o.deleted else ""), fmt.human_size(o.size), o.revision,
          fmt.human_time_ms(o.ts_ms), o.sha256[:16]] for o in objects])


# ---------------------------------------------------------------------------------------------
# Buckets.


async def _add(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).CreateBucket(objects_pb2.CreateBucketRequest(
        config=objects_pb2.BucketConfig(name=args.bucket, replicas=args.replicas,
                                        description=args.description)),
        timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: f"created bucket {args.bucket} "
         f"(stream {info.stream})")
    return EXIT_OK


async def _buckets(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListBuckets(objects_pb2.ListBucketsRequest(),
                                            timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: fmt.render_table(
        ["BUCKET", "REPLICAS", "MESSAGES", "BYTES", "DESCRIPTION"],
        [[b.config.name, b.config.replicas, fmt.human_count(b.messages),
          fmt.human_size(b.bytes), b.config.description] for b in reply.buckets]))
    return EXIT_OK


async def _rm_bucket(client: Client, args: argparse.Namespace) -> int:
    if not args.force:
        raise UsageError(f"deleting bucket {args.bucket} removes every object in it: "
                         "add --force")
    await _stub(client).DeleteBucket(objects_pb2.DeleteBucketRequest(name=args.bucket),
                                     timeout=client.deadline_s())
    emit(args, {"deleted": args.bucket}, lambda: f"deleted bucket {args.bucket}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Objects.


async def _put(client: Client, args: argparse.Namespace) -> int:
    if args.file == "-":
        name, source, size = args.name, sys.stdin.buffer, 0
        if not name:
            raise UsageError("give --name when the content comes from stdin")
    else:
        path = Path(args.file)
        try:
            source = path.open("rb")
            size = os.fstat(source.fileno()).st_size
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc}") from None
        name = args.name or path.name
    progress = Progress(f"put {name}", size, shown=_shown(args))
    frames = _file_frames(args, name, source, progress)
    try:
        info = await _stub(client).PutStream(frames, timeout=_transfer_deadline_s(client, size))
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    progress.finish()
    emit(args, fmt.proto_dict(info), lambda: f"stored {args.bucket}/{info.name}: "
         f"{fmt.human_size(info.size)} in {info.chunk_count} chunks, revision "
         f"{info.revision}, sha256 {info.sha256}")
    return EXIT_OK


async def _file_frames(args: argparse.Namespace, name: str, source: BinaryIO,
                       progress: Progress) -> AsyncIterator[objects_pb2.PutObjectFrame]:
    chunk_bytes = args.chunk_size or limits.object_chunk_bytes_default
    yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(
        bucket=args.bucket, name=name, chunk_size=args.chunk_size,
        headers=[types_pb2.Header(key=k, value=v) for k, v in args.header]))
    hasher = hashlib.sha256()
    while True:
        data = source.read(chunk_bytes)
        if not data:
            break
        hasher.update(data)
        progress.add(len(data))
        yield objects_pb2.PutObjectFrame(data=data)
    yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish(
        sha256=hasher.hexdigest()))


async def _get(client: Client, args: argparse.Namespace) -> int:
    stub = _stub(client)
    info = await stub.GetInfo(objects_pb2.GetObjectInfoRequest(
        bucket=args.bucket, name=args.name), timeout=client.deadline_s())
    target = args.output or Path(args.name).name
    progress = Progress(f"get {args.name}", info.size, shown=_shown(args))
    partial = None if target == "-" else Path(f"{target}.partial")
    sink: BinaryIO = sys.stdout.buffer if partial is None else partial.open("wb")
    hasher = hashlib.sha256()
    try:
        call = stub.GetStream(objects_pb2.GetObjectRequest(bucket=args.bucket, name=args.name),
                              timeout=_transfer_deadline_s(client, info.size))
        async for frame in call:
            if frame.WhichOneof("frame") == "info":
                info = frame.info
                continue
            hasher.update(frame.data)
            sink.write(frame.data)
            progress.add(len(frame.data))
    finally:
        if partial is not None:
            sink.close()
    progress.finish()
    if hasher.hexdigest() != info.sha256:
        warn(f"error: the content received hashes to {hasher.hexdigest()}, not to the "
             f"object's sha256 {info.sha256}" + (f"; kept as {partial}" if partial else ""))
        return EXIT_ERROR
    if partial is not None:
        partial.replace(target)
    if target != "-":
        emit(args, fmt.proto_dict(info), lambda: f"wrote {target}: "
             f"{fmt.human_size(info.size)}, sha256 {info.sha256} (checked)")
    return EXIT_OK


async def _info(client: Client, args: argparse.Namespace) -> int:
    info = await _stub(client).GetInfo(objects_pb2.GetObjectInfoRequest(
        bucket=args.bucket, name=args.name, include_deleted=True), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: object_text(info))
    return EXIT_OK


async def _ls(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).List(objects_pb2.ListObjectsRequest(
        bucket=args.bucket, prefix=args.prefix, include_deleted=args.all, limit=args.limit),
        timeout=client.deadline_s())

    def text() -> str:
        table = _objects_table(reply.objects)
        return table + ("\n(more objects match: raise --limit)" if reply.truncated else "")

    emit(args, fmt.proto_dict(reply), text)
    return EXIT_OK


async def _rm(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).Delete(objects_pb2.DeleteObjectRequest(
        bucket=args.bucket, name=args.name), timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: f"deleted {args.bucket}/{args.name} at "
         f"revision {reply.revision}")
    return EXIT_OK


async def _revisions(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListRevisions(objects_pb2.ListObjectRevisionsRequest(
        bucket=args.bucket, name=args.name, from_revision=args.from_revision,
        limit=args.limit), timeout=client.deadline_s())

    def text() -> str:
        lines = [_objects_table(reply.revisions)]
        if reply.next_revision:
            lines.append(f"(more: --from-revision {reply.next_revision})")
        return "\n".join(lines)

    emit(args, fmt.proto_dict(reply), text)
    return EXIT_OK
