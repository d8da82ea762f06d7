"""Moving streams: `raftlog stream migrate|pin|unpin` and `raftlog cluster
rebalance|clear-authority`, admin calls of the Cluster service (they need the cluster secret);
and the steps of a rebalance, from --plan FILE (or stdin) or STREAM=NODE pairs, read and checked
before connecting, so bad input exits 2 and sends nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    emit,
    leaf,
    warn,
    with_client,
)
from raftlog.node.cli.client import Client
from raftlog.node.cli.cluster_base import LocalHandler, stub
from raftlog.v1 import cluster_pb2

# A move may take the node up to 3 catch-up attempts of 30 s each plus a handover: the deadline
# of `stream migrate` is --timeout plus this, and `cluster rebalance` adds it once per step.
move_wait_s = 100.0


def add_placement_commands(cluster: Any, stream: Any) -> None:
    migrate = leaf(
        stream,
        "migrate",
        _stream_migrate,
        "move a stream's primary to NODE: it becomes a replica if it is not one, catches up, "
        f"then takes over at the next fence epoch (the deadline is --timeout + {move_wait_s:g}s)",
    )
    migrate.add_argument("name", metavar="NAME")
    migrate.add_argument("target", metavar="NODE", help="node id of the new primary")
    migrate.add_argument(
        "--pin", action="store_true", help="keep the stream on NODE (exempt from clean-up)"
    )
    pin = leaf(stream, "pin", _stream_pin, "pin a stream to its authority override's node")
    pin.add_argument("name", metavar="NAME")
    unpin = leaf(stream, "unpin", _stream_unpin, "release a pinned authority override")
    unpin.add_argument("name", metavar="NAME")

    rebalance = leaf(
        cluster,
        "rebalance",
        _cluster_rebalance,
        "run a plan of stream moves in order, one outcome per step (exit 1 if any step failed)",
    )
    rebalance.add_argument(
        "pairs",
        nargs="*",
        metavar="STREAM=NODE",
        help="a step: move STREAM's primary to NODE (or give --plan)",
    )
    rebalance.add_argument(
        "--plan",
        metavar="FILE",
        help='JSON steps, [{"stream": "a", "target": "n2"}, ...] or {"steps": [...]}; '
        "- reads stdin",
    )
    rebalance.add_argument(
        "--stop-on-error", action="store_true", help="stop at the first failed step"
    )
    # The plan is read and checked before connecting: bad input exits 2 and sends nothing.
    rebalance.set_defaults(run=_with_plan(with_client(_cluster_rebalance)))
    clear = leaf(
        cluster,
        "clear-authority",
        _cluster_clear_authority,
        "drop a stream's authority override (placement falls back to the ring)",
    )
    clear.add_argument("name", metavar="NAME")


async def _stream_migrate(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.MigrateStreamRequest(stream=args.name, target=args.target, pin=args.pin)
    answer = await stub(client).MigrateStream(
        request, timeout=client.deadline_s(extra_s=move_wait_s),
        metadata=client.admin("MigrateStream")
    )
    emit(args, fmt.proto_dict(answer), lambda: migrate_text(answer, pinned=args.pin))
    return EXIT_OK


def migrate_text(answer: cluster_pb2.MigrateStreamResponse, *, pinned: bool = False) -> str:
    fields: list[tuple[str, object]] = [
        ("Primary", f"{answer.from_node or '?'} -> {answer.to_node}"),
        ("Fence epoch", answer.fence_epoch),
        ("Start seq", answer.epoch_start_seq or "-"),
        ("Outcome", answer.outcome or "-"),
        ("Attempts", answer.attempts),
    ]
    if pinned:
        fields.append(("Pinned", "yes"))
    return fmt.render_block(f"Stream {answer.stream}", fields)


async def _stream_pin(client: Client, args: argparse.Namespace) -> int:
    return await _set_pinned(client, args, pinned=True)


async def _stream_unpin(client: Client, args: argparse.Namespace) -> int:
    return await _set_pinned(client, args, pinned=False)


async def _set_pinned(client: Client, args: argparse.Namespace, *, pinned: bool) -> int:
    request = cluster_pb2.SetStreamPinnedRequest(stream=args.name, pinned=pinned)
    await stub(client).SetStreamPinned(request, timeout=client.deadline_s(),
                                       metadata=client.admin("SetStreamPinned"))
    document = {"stream": args.name, "pinned": pinned}
    if pinned:
        text = f"stream {args.name} pinned to its authority override's node"
    else:
        text = f"stream {args.name} unpinned"
    emit(args, document, lambda: text)
    return EXIT_OK


async def _cluster_clear_authority(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.ClearStreamAuthorityRequest(stream=args.name)
    answer = await stub(client).ClearStreamAuthority(
        request, timeout=client.deadline_s(), metadata=client.admin("ClearStreamAuthority"))
    document = {"stream": args.name, **fmt.proto_dict(answer)}
    if answer.cleared:
        text = f"cleared the authority override of stream {args.name}"
    else:
        text = f"stream {args.name} had no authority override: nothing cleared"
    emit(args, document, lambda: text)
    return EXIT_OK


def _with_plan(run: LocalHandler) -> LocalHandler:
    """Parses --plan or the STREAM=NODE pairs into `args.steps` before `run` connects."""

    def planned(args: argparse.Namespace) -> int:
        args.steps = plan_steps(args.plan, args.pairs)
        return run(args)

    return planned


def plan_steps(plan: str | None, pairs: Sequence[str]) -> list[cluster_pb2.RebalanceStep]:
    """The steps of `cluster rebalance`, from a --plan file (`-` = stdin) or STREAM=NODE pairs;
    raises UsageError naming what is wrong."""
    if plan is not None and pairs:
        raise UsageError("give --plan FILE or STREAM=NODE pairs, not both")
    if plan is None:
        if not pairs:
            raise UsageError("nothing to do: give --plan FILE (or -) or STREAM=NODE pairs")
        return [_pair_step(pair) for pair in pairs]
    source = "stdin" if plan == "-" else plan
    try:
        text = sys.stdin.read() if plan == "-" else Path(plan).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --plan {source}: {exc}") from None
    return parse_plan(text, source=source)


def _pair_step(pair: str) -> cluster_pb2.RebalanceStep:
    stream, sep, target = pair.partition("=")
    if not sep or not stream or not target or "=" in target:
        raise UsageError(f"not a STREAM=NODE pair: {pair!r}")
    return _step(stream, target, where=f"pair {pair!r}")


def parse_plan(text: str, *, source: str = "plan") -> list[cluster_pb2.RebalanceStep]:
    """`[{"stream": "a", "target": "n2"}, ...]` or `{"steps": [...]}` -> steps."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--plan {source} is not JSON: {exc}") from None
    if isinstance(document, dict):
        if set(document) != {"steps"}:
            raise UsageError(
                f'--plan {source}: an object plan has exactly one key, "steps" '
                f"(found {', '.join(map(repr, sorted(document))) or 'none'})"
            )
        document = document["steps"]
    if not isinstance(document, list):
        raise UsageError(
            f'--plan {source}: expected a list of {{"stream": ..., "target": ...}} steps'
        )
    if not document:
        raise UsageError(f"--plan {source} has no steps")
    steps = []
    for number, item in enumerate(document, start=1):
        where = f"--plan {source}, step {number}"
        if not isinstance(item, dict):
            raise UsageError(f'{where}: expected {{"stream": ..., "target": ...}}, got {item!r}')
        unknown = sorted(set(item) - {"stream", "target"})
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r} (a step has stream and target)")
        stream, target = _plan_string(item, "stream", where), _plan_string(item, "target", where)
        steps.append(_step(stream, target, where=where))
    return steps


def _plan_string(item: dict[str, object], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: {key!r} must be a non-empty string, not {value!r}")
    return value


def _step(stream: str, target: str, *, where: str) -> cluster_pb2.RebalanceStep:
    try:
        subjects.validate_name(stream, what="stream")
        subjects.validate_name(target, what="node")
    except RaftlogError as exc:
        raise UsageError(f"{where}: {exc.message}") from None
    return cluster_pb2.RebalanceStep(stream=stream, target=target)


async def _cluster_rebalance(client: Client, args: argparse.Namespace) -> int:
    steps: list[cluster_pb2.RebalanceStep] = args.steps
    request = cluster_pb2.RebalanceStreamsRequest(steps=steps, stop_on_error=args.stop_on_error)
    deadline = client.deadline_s(extra_s=move_wait_s * len(steps))
    answer = await stub(client).RebalanceStreams(request, timeout=deadline,
                                                 metadata=client.admin("RebalanceStreams"))
    emit(args, fmt.proto_dict(answer), lambda: rebalance_text(answer))
    if answer.failed:
        not_run = sum(1 for o in answer.outcomes if not o.ran)
        warn(
            fmt.error_text(
                "STEPS_FAILED",
                f"{answer.failed} of {len(answer.outcomes)} steps failed, {not_run} not run",
                {},
            )
        )
        return EXIT_ERROR
    return EXIT_OK


def step_outcome_text(outcome: cluster_pb2.RebalanceStepOutcome) -> str:
    if not outcome.ran:
        return "not run"
    if outcome.ok:
        moved = outcome.result
        return f"ok: {moved.from_node or '?'} -> {moved.to_node}, fence epoch {moved.fence_epoch}"
    error = outcome.error
    return fmt.error_text(error.reason or "UNKNOWN", error.message, error.metadata)


def rebalance_text(answer: cluster_pb2.RebalanceStreamsResponse) -> str:
    rows = [
        (number, o.step.stream, o.step.target, step_outcome_text(o))
        for number, o in enumerate(answer.outcomes, start=1)
    ]
    table = fmt.render_table(["STEP", "STREAM", "TARGET", "OUTCOME"], rows, right_align=[0])
    not_run = sum(1 for o in answer.outcomes if not o.ran)
    summary = f"{answer.succeeded} succeeded, {answer.failed} failed, {not_run} not run"
    return f"{table}\n\n{summary}"
