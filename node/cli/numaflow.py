"""`raftlog numaflow-source`: serve a stream, or the partitions of a topic, to Numaflow as a
user-defined source (a sidecar in the source vertex pod; the server itself is
node/cli/numaflow_source.py, docs/numaflow.md).

    raftlog numaflow-source --stream S --consumer C --socket /var/run/numaflow/source.sock \\
        --server-info /var/run/numaflow/sourcer-server-info --server n1:7400,n2:7400,n3:7400
    raftlog numaflow-source --topic T --consumer C --replicas 2 --socket ... (replica
        $NUMAFLOW_REPLICA serves the partitions p with p % 2 == replica)

The consumer (for a topic: the group, on every served partition) must exist (exit 1 with the
node's error otherwise) unless `--create-consumer` is given, which creates it with `--ack-wait`
(creating an existing one with the same settings is accepted). An unknown or incomplete topic
also ends it with exit 1. SIGTERM or Ctrl-C stops it: the server-info file and the socket are
removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from raftlog.base import subjects, topics
from raftlog.base.errors import RaftlogError
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    address_list,
    tls_from,
    typed,
    warn,
)
from raftlog.node.cli.bearer import TOKEN_ENV
from raftlog.node.cli.client import default_server, describe_failure
from raftlog.v1 import consumers_pb2

# node/cli/numaflow_source.py (and the source.v1 protos) load only when the command runs: a
# process that imports the CLI may hold numaproj's own source.v1 stubs, which define the same
# proto symbols in the default descriptor pool.
if TYPE_CHECKING:
    from raftlog.node.cli.numaflow_source import Backend, SourceConfig

COMMAND = "numaflow-source"
REPLICA_ENV = "NUMAFLOW_REPLICA"
# numa calls NackFn only when the server-info file names python >= 0.11.0 (go/java >= 0.11.0,
# rust >= 0.4.0), and checks its own version against minimum_numaflow_version (1.4.0 brought
# the streaming protocol served here).
SERVER_INFO_DEFAULT = {"protocol": "uds", "language": "python", "version": "0.11.0",
                       "minimum_numaflow_version": "1.4.0-z", "metadata": {}}


def default_partition() -> int:
    """The SDKs' default: each replica of the source vertex is one watermark partition. It is
    also this replica's index (numa sets $NUMAFLOW_REPLICA in every container of the pod, but
    not the replica count)."""
    text = os.environ.get(REPLICA_ENV, "0").strip() or "0"
    return int(text) if text.isdigit() else 0


def add_numaflow_command(commands: Any) -> None:
    help_text = ("serve a stream or a topic to Numaflow as a user-defined source (a sidecar on "
                 "a Unix socket)")
    parser = commands.add_parser(COMMAND, help=help_text, description=help_text)
    parser.add_argument("--stream", default=None, metavar="S",
                        help="the stream to read (or --topic)")
    parser.add_argument("--topic", default=None, metavar="T",
                        help="read every partition of this topic assigned to this replica; "
                        "each partition is a watermark partition (or --stream)")
    parser.add_argument("--consumer", required=True, metavar="C",
                        help="the durable consumer (for a topic: the group) that keeps the read "
                        "position and the acks")
    parser.add_argument("--socket", required=True, type=Path, metavar="PATH",
                        help="Unix socket to listen on (numa: /var/run/numaflow/source.sock)")
    parser.add_argument("--server-info", type=Path, default=None, metavar="PATH",
                        help="server-info file to write once listening (numa: "
                        "/var/run/numaflow/sourcer-server-info)")
    parser.add_argument("--server", dest="servers", type=typed(address_list), default=None,
                        metavar="HOST:PORT[,HOST:PORT...]",
                        help="nodes of the cluster, tried in turn (default: $RAFTLOG_SERVER "
                        "or 127.0.0.1:7400)")
    parser.add_argument("--create-consumer", action="store_true",
                        help="create the consumer (deliver all) if it does not exist")
    parser.add_argument("--ack-wait", type=typed(fmt.parse_duration_ms), default=None,
                        metavar="DURATION", help="with --create-consumer: redeliver a read "
                        "that numa has not acked within this (default: the node's, 30s)")
    parser.add_argument("--nack-delay", type=typed(fmt.parse_duration_ms), default=0,
                        metavar="DURATION", help="a nacked record is redelivered after this "
                        "(default 0)")
    parser.add_argument("--partition", type=int, default=None, metavar="N",
                        help="with --stream: the watermark partition of every record (default: "
                        "$NUMAFLOW_REPLICA or 0)")
    parser.add_argument("--replica", type=int, default=None, metavar="I",
                        help="with --topic: this replica's index (default: $NUMAFLOW_REPLICA "
                        "or 0); it serves the partitions p with p %% replicas == I")
    parser.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="with --topic: how many replicas share the topic (default 1; "
                        "numa does not tell a sidecar, so pin the vertex's scale to N)")
    parser.add_argument("--server-info-json", default=None, metavar="JSON",
                        help="fields of the server-info file (default "
                        f"{json.dumps(SERVER_INFO_DEFAULT)}; see docs/numaflow.md)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None, metavar="TOKEN",
                        help=f"a user's token, once the cluster has users (default: ${TOKEN_ENV};"
                        " docs/auth.md)")
    parser.set_defaults(run=_run)


def _server_info(text: str | None) -> dict[str, Any]:
    if text is None:
        return dict(SERVER_INFO_DEFAULT)
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--server-info-json: not JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise UsageError("--server-info-json: must be a JSON object")
    return fields


def _check_usage(args: argparse.Namespace) -> None:
    """Raises UsageError (exit 2, one line) for options that do not go together."""
    if (args.stream is None) == (args.topic is None):
        raise UsageError("give either --stream S or --topic T" if args.stream is None else
                         "--stream and --topic exclude each other: give one")
    try:
        if args.stream is not None:
            subjects.validate_name(args.stream, what="stream")
        else:
            topics.validate_topic(args.topic)
        subjects.validate_name(args.consumer, what="consumer")
    except RaftlogError as err:
        raise UsageError(err.message) from None
    if args.ack_wait is not None and not args.create_consumer:
        raise UsageError("--ack-wait applies only with --create-consumer")
    if args.stream is not None and (args.replica, args.replicas) != (None, None):
        raise UsageError("--replica and --replicas apply only with --topic")
    if args.topic is not None and args.partition is not None:
        raise UsageError("--partition applies only with --stream (with --topic each record's "
                         "partition is its topic partition)")
    if args.replicas is not None and args.replicas < 1:
        raise UsageError(f"--replicas must be at least 1, not {args.replicas}")
    replicas = args.replicas or 1
    replica = default_partition() if args.replica is None else args.replica
    if args.topic is not None and not 0 <= replica < replicas:
        source = "--replica" if args.replica is not None else f"${REPLICA_ENV}"
        raise UsageError(f"{source} is {replica}, but with --replicas {replicas} a replica is "
                         f"0..{replicas - 1}")


def _run(args: argparse.Namespace) -> int:
    _check_usage(args)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    servers = args.servers or (getattr(args, "server", None) or default_server(),)
    create = None
    if args.create_consumer:
        create = consumers_pb2.ConsumerConfig(name=args.consumer, ack_wait_ms=args.ack_wait or 0)
    return asyncio.run(_main(args, servers=list(servers), create=create,
                             server_info=_server_info(args.server_info_json)))


async def _config(args: argparse.Namespace, backend: Backend) -> SourceConfig:
    """What this sidecar serves: the stream, or its replica's share of the topic (asked of the
    cluster)."""
    from raftlog.node.cli.numaflow_source import SourceConfig, topic_config

    if args.stream is not None:
        return SourceConfig.for_stream(
            stream=args.stream, consumer=args.consumer,
            partition=default_partition() if args.partition is None else args.partition,
            nack_delay_ms=args.nack_delay)
    return await topic_config(
        backend, topic=args.topic, consumer=args.consumer,
        replica=default_partition() if args.replica is None else args.replica,
        replicas=args.replicas or 1, nack_delay_ms=args.nack_delay)


async def _main(args: argparse.Namespace, *, servers: list[str],
                create: consumers_pb2.ConsumerConfig | None, server_info: dict[str, Any]) -> int:
    from raftlog.node.cli.numaflow_source import (
        Backend,
        BackendDown,
        SetupError,
        check_consumer,
        serve,
    )

    backend = Backend(servers, token=args.token or getattr(args, "user_token", None),
                      tls=tls_from(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            config = await _config(args, backend)
            await check_consumer(backend, config, create=create)
        except grpc.aio.AioRpcError as exc:
            warn(describe_failure(exc, address=backend.address))
            return EXIT_ERROR
        except (BackendDown, SetupError) as exc:
            warn(f"error: {exc}")
            return EXIT_ERROR
        await serve(backend=backend, config=config, socket_path=args.socket,
                    server_info_path=args.server_info, server_info=server_info, stop=stop)
        return EXIT_OK
    finally:
        await backend.close()
