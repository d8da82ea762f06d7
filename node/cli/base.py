"""What every `raftlog` command shares: the --server/--timeout/--json options, argparse types,
exit codes, output, and running a command's coroutine against a `Client`.

A command module adds its subcommands with `leaf(...)` (a subcommand whose handler gets a
connected `Client`) and `group(...)` (a command with actions, like `stream create`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from raftlog.node.cli import format as fmt
from raftlog.node.cli.bearer import TOKEN_ENV
from raftlog.node.cli.client import (
    SECRET_FILE_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    Client,
    call_timeout_s_default,
    default_server,
    describe_failure,
    tls_credentials,
)
from raftlog.node.transport.credentials import Credential, WeakSecret, read_secret_file

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[Client, argparse.Namespace], Awaitable[int]]


class UsageError(Exception):
    """Bad usage found after parsing; exit status 2."""


def common_options(*, per_command: bool) -> argparse.ArgumentParser:
    """--server/--timeout/--json, accepted before the command and after it. Per command the
    defaults are suppressed so that a value given before the command is kept."""
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("connection and output")

    def default(value: object) -> object:
        return argparse.SUPPRESS if per_command else value

    group.add_argument(
        "--server",
        metavar="HOST:PORT",
        type=typed(address),
        default=default(default_server()),
        help="node to talk to (default: $RAFTLOG_SERVER or 127.0.0.1:7400)",
    )
    group.add_argument(
        "--timeout",
        metavar="DURATION",
        type=typed(seconds),
        default=default(call_timeout_s_default),
        help="deadline of each call (default 10s, 0 = none; fetch adds its --wait)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print one JSON document on stdout instead of text",
    )
    group.add_argument(
        "--secret-file",
        dest="admin_secret_file",
        metavar="FILE",
        type=Path,
        default=default(env_path(SECRET_FILE_ENV)),
        help="the cluster secret, for calls that change membership or placement "
        "(default: $RAFTLOG_SECRET_FILE)",
    )
    group.add_argument(
        "--token",
        dest="user_token",
        metavar="TOKEN",
        default=default(os.environ.get(TOKEN_ENV) or None),
        help="a user's token, sent on every call once the cluster has users (default: "
        f"${TOKEN_ENV}; docs/auth.md)",
    )
    for flag, env, what in (("--tls-ca", TLS_CA_ENV, "connect over TLS, trusting this CA"),
                            ("--tls-cert", TLS_CERT_ENV, "a client certificate to present"),
                            ("--tls-key", TLS_KEY_ENV, "its private key")):
        group.add_argument(flag, dest=f"client_{flag[2:].replace('-', '_')}", metavar="FILE",
                           type=Path, default=default(env_path(env)),
                           help=f"{what} (PEM; default ${env}; docs/tls.md)")
    return options


def tls_from(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """The TLS credentials of --tls-ca/--tls-cert/--tls-key, None without them; UsageError
    when they cannot be used."""
    try:
        return tls_credentials(ca=getattr(args, "client_tls_ca", None),
                               cert=getattr(args, "client_tls_cert", None),
                               key=getattr(args, "client_tls_key", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read a TLS file: {exc}") from None


def env_path(name: str) -> Path | None:
    """The path an environment variable names, None when it is unset or empty."""
    value = os.environ.get(name, "")
    return Path(value) if value else None


def credential_from(args: argparse.Namespace) -> Credential | None:
    """The credential of --secret-file, if given; UsageError when the file is unusable."""
    path: Path | None = getattr(args, "admin_secret_file", None)
    if path is None:
        return None
    try:
        return Credential(read_secret_file(path))
    except OSError as exc:
        raise UsageError(f"cannot read --secret-file: {exc}") from None
    except WeakSecret as exc:
        raise UsageError(f"--secret-file {path}: {exc}") from None


def leaf(commands: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=help_text, parents=[common_options(per_command=True)]
    )
    parser.set_defaults(run=with_client(handler))
    return parser


def group(commands: Any, name: str, help_text: str) -> Any:
    parser = commands.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)


# ---------------------------------------------------------------------------------------------
# Argument types.


def typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ValueError (argparse then exits 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if text.startswith("unix:"):
        return text
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a HOST:PORT address: {text!r}")
    return text


def address_list(text: str) -> tuple[str, ...]:
    return tuple(address(part.strip()) for part in text.split(",") if part.strip())


def seconds(text: str) -> float:
    return fmt.parse_duration_ms(text) / 1000


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


# ---------------------------------------------------------------------------------------------
# Output and running.


def show(text: str) -> None:
    print(text, flush=True)


def warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, document: object, text: Callable[[], str]) -> None:
    """Prints the JSON document with --json, else the text."""
    show(fmt.to_json(document) if args.json else text())


def with_client(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return asyncio.run(_call(handler, args))

    return run


async def _call(handler: Handler, args: argparse.Namespace) -> int:
    async with Client(args.server, timeout_s=args.timeout or None,
                      credential=credential_from(args), tls=tls_from(args),
                      token=getattr(args, "user_token", None)) as client:
        try:
            return await handler(client, args)
        except grpc.RpcError as exc:
            warn(describe_failure(exc, address=args.server))
            return EXIT_ERROR
