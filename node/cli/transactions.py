"""`raftlog txn ...`: two-phase publishes through the raftlog.v1 Transactions service
(docs/transactions.md): prepare a message out of sight, then commit or roll it back by its
transaction id; list the open ones.

A payload, or a key on the command line, is UTF-8 text, or `base64:...`.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import EXIT_OK, emit, group, leaf, non_negative, typed
from raftlog.node.cli.client import Client
from raftlog.v1 import transactions_pb2, transactions_pb2_grpc, types_pb2


def add_txn_commands(commands: Any) -> None:
    txn = group(commands, "txn", "transactions: prepare a message, then commit or roll back")
    prepare = leaf(txn, "prepare", _prepare, "store a message out of sight; prints its id")
    prepare.add_argument("stream", metavar="STREAM", nargs="?", default="",
                         help="the target stream (or --topic)")
    prepare.add_argument("payload", metavar="PAYLOAD")
    prepare.add_argument("--subject", default="",
                         help="the message's subject (default for a topic: the topic name)")
    prepare.add_argument("--topic", default="", metavar="TOPIC",
                         help="a topic instead of a stream")
    target = prepare.add_mutually_exclusive_group()
    target.add_argument("--key", metavar="KEY", help="hashed to the topic's partition")
    target.add_argument("--partition", type=non_negative, metavar="P")
    prepare.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                         type=typed(fmt.parse_header))
    prepare.add_argument("--msg-id", default="", metavar="ID")
    prepare.add_argument("--txn-timeout", type=typed(fmt.parse_duration_ms), default=0,
                         metavar="DURATION",
                         help="rolled back when not ended within this (default 60s)")
    leaf(txn, "commit", _commit, "append a prepared message to its stream").add_argument(
        "txn_id", metavar="ID")
    leaf(txn, "rollback", _rollback, "drop a prepared message").add_argument(
        "txn_id", metavar="ID")
    listing = leaf(txn, "ls", _ls, "open transactions, oldest first")
    listing.add_argument("stream", metavar="STREAM", nargs="?", default="")
    listing.add_argument("--topic", default="", metavar="TOPIC")
    listing.add_argument("--older-than", type=typed(fmt.parse_duration_ms), default=0,
                         metavar="DURATION")


def _stub(client: Client) -> Any:
    return transactions_pb2_grpc.TransactionsStub(client.channel)  # type: ignore[no-untyped-call]


async def _prepare(client: Client, args: argparse.Namespace) -> int:
    request = transactions_pb2.PrepareRequest(
        stream=args.stream, topic=args.topic, subject=args.subject,
        payload=fmt.decode_payload_arg(args.payload),
        headers=[types_pb2.Header(key=k, value=v) for k, v in args.header], msg_id=args.msg_id,
        timeout_ms=args.txn_timeout)
    if args.key is not None:
        request.key = fmt.decode_payload_arg(args.key)
    elif args.partition is not None:
        request.partition = args.partition
    reply = await _stub(client).Prepare(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: reply.txn_id)
    return EXIT_OK


async def _commit(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).Commit(transactions_pb2.CommitRequest(txn_id=args.txn_id),
                                       timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: f"committed: {reply.stream} seq {reply.seq}"
         + (" (already committed)" if reply.duplicate else ""))
    return EXIT_OK


async def _rollback(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).Rollback(transactions_pb2.RollbackRequest(txn_id=args.txn_id),
                                         timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: "rolled back"
         + (" (already rolled back)" if reply.duplicate else ""))
    return EXIT_OK


def _ls_text(reply: transactions_pb2.ListTransactionsResponse) -> str:
    if not reply.transactions:
        return "(no open transactions)"
    lines = [f"{'id':<32}  {'stream':<20}  {'subject':<16}  {'bytes':>7}  {'age':>8}  "
             f"{'left':>8}  {'checks':>6}"]
    for t in reply.transactions:
        left_ms = max(t.timeout_ms - t.age_ms, 0)
        state = "  committing" if t.committing else ""
        lines.append(f"{t.txn_id:<32}  {t.stream:<20}  {t.subject:<16}  {t.payload_bytes:>7}  "
                     f"{fmt.human_duration_ms(t.age_ms):>8}  {fmt.human_duration_ms(left_ms):>8}  "
                     f"{t.checks:>6}{state}")
    if reply.truncated:
        lines.append("(more not shown)")
    return "\n".join(lines)


async def _ls(client: Client, args: argparse.Namespace) -> int:
    reply = await _stub(client).ListTransactions(transactions_pb2.ListTransactionsRequest(
        stream=args.stream, topic=args.topic, older_than_ms=args.older_than),
        timeout=client.deadline_s())
    emit(args, fmt.proto_dict(reply), lambda: _ls_text(reply))
    return EXIT_OK
