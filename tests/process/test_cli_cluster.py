"""The placement and authority commands of the `raftlog` CLI: `stream migrate|pin|unpin` and
`cluster rebalance|clear-authority`, run in-process through `main()` with stdout/stderr captured,
against a real 3-node cluster (`cluster3`); plan parsing and bad input without a node.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import free_port, wait_until
from raftlog.node.cli import cluster_placement as cli_cluster
from raftlog.node.cli.base import UsageError
from raftlog.node.cli.main import main
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

call_timeout_s = 15.0


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)

    def ok(self) -> Run:
        assert self.code == 0, self.err
        return self


class Cli:
    """cli("stream", "ls") runs `raftlog --server <address> stream ls` in this process."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str], *,
                 secret_file: Path | None = None) -> None:
        self.address = address
        self.capsys = capsys
        self.options = ["--server", address]
        if secret_file is not None:
            self.options += ["--secret-file", str(secret_file)]

    def __call__(self, *args: str, stdin: str | None = None) -> Run:
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        try:
            code = main([*self.options, *args])
        finally:
            sys.stdin = sys.__stdin__
        captured = self.capsys.readouterr()
        return Run(code, captured.out, captured.err)


@pytest.fixture
def cli(cluster3: LocalCluster, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(cluster3.address(1), capsys, secret_file=cluster3.secret_path)


@pytest.fixture
def offline(capsys: pytest.CaptureFixture[str]) -> Cli:
    """A CLI pointed at a port where nothing listens: a command that connected would exit 1
    with `cannot reach`, so exit 2 shows that nothing was sent."""
    return Cli(f"127.0.0.1:{free_port()}", capsys)


def route(cluster: LocalCluster, stream: str) -> cluster_pb2.RouteExplanation:
    answer: cluster_pb2.RouteExplanation = cluster.cluster(1).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s
    )
    return answer


def settles(cluster: LocalCluster, stream: str, what: str, **expected: object) -> None:
    """Waits until node 1 has applied the change: its route shows the `expected` fields."""

    def seen() -> bool:
        answer = route(cluster, stream)
        return all(getattr(answer, key) == value for key, value in expected.items())

    wait_until(seen, 5, what=what)


def table_rows(text: str) -> list[str]:
    """The lines of the first table in `text` (up to the first blank line), header first."""
    return text.split("\n\n")[0].splitlines()


# ---------------------------------------------------------------------------------------------
# Against a 3-node cluster.


def test_migrate_rebalance_pin_and_clear_authority(
    cluster3: LocalCluster, cli: Cli, tmp_path: Path
) -> None:
    cluster3.streams(1).CreateStream(
        streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name="orders")),
        timeout=call_timeout_s,
    )
    for n in range(3):
        cluster3.streams(1).Publish(
            streams_pb2.PublishRequest(stream="orders", subject="o", payload=b"%d" % n),
            timeout=call_timeout_s,
        )
    before = route(cluster3, "orders")
    assert before.primary == before.ring_owner
    # Not the ring owner: the placement janitor clears an unpinned override to the ring owner.
    target = next(node for node in before.replicas if node != before.primary)

    # stream migrate: JSON names the new primary and a higher fence epoch.
    moved = cli("stream", "migrate", "orders", target, "--json").json()
    assert (moved["stream"], moved["from_node"], moved["to_node"]) == (
        "orders",
        before.primary,
        target,
    )
    assert moved["fence_epoch"] > before.fence_epoch
    assert moved["epoch_start_seq"] == 4 and moved["attempts"] >= 1
    settles(cluster3, "orders", "the move", primary=target, override_claimant=target)

    # Moving it where it already is: the human key/value block.
    text = cli("stream", "migrate", "orders", target).ok().out
    assert text.splitlines()[0] == "Stream orders"
    assert f"Primary:      {target} -> {target}" in text
    assert "Outcome:      already the primary" in text
    assert f"Fence epoch:  {moved['fence_epoch']}" in text

    # pin / unpin, and clear-authority refusing a pinned override and then clearing it.
    assert cli("stream", "pin", "orders", "--json").json() == {"stream": "orders", "pinned": True}
    settles(cluster3, "orders", "the pin", pinned=True)
    overrides = cli("cluster", "overrides", "--json").json()["overrides"]
    assert [(o["stream"], o["claimant"], o["pinned"]) for o in overrides] == [
        ("orders", target, True)
    ]
    run = cli("cluster", "clear-authority", "orders")
    assert run.code == 1
    assert run.err.startswith("error: STREAM_PINNED: ")
    assert "unpin" in run.err
    assert cli("stream", "unpin", "orders").ok().out.strip() == "stream orders unpinned"
    settles(cluster3, "orders", "the unpin", pinned=False)
    cleared = cli("cluster", "clear-authority", "orders", "--json").json()
    assert cleared == {"stream": "orders", "cleared": True}
    settles(cluster3, "orders", "the clearing", override_claimant="")
    text = cli("cluster", "clear-authority", "orders").ok().out
    assert text.strip() == "stream orders had no authority override: nothing cleared"

    # Without an override there is nothing to pin: the node's reason, exit 1.
    run = cli("stream", "pin", "orders")
    assert run.code == 1
    assert run.err.startswith("error: INVALID_ARGUMENT: ")

    # cluster rebalance from a plan file: one good step, one bad; exit 1, both in the table.
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            [
                {"stream": "orders", "target": before.primary},
                {"stream": "missing", "target": before.primary},
            ]
        )
    )
    run = cli("cluster", "rebalance", "--plan", str(plan))
    assert run.code == 1, run.err
    rows = table_rows(run.out)
    assert rows[0].split() == ["STEP", "STREAM", "TARGET", "OUTCOME"]
    assert rows[1].split()[:4] == ["1", "orders", before.primary, "ok:"]
    assert f"{target} -> {before.primary}" in rows[1]
    assert rows[2].split()[:5] == ["2", "missing", before.primary, "error:", "STREAM_NOT_FOUND:"]
    assert rows[1].index("ok:") == rows[2].index("error:")  # aligned columns
    assert "1 succeeded, 1 failed, 0 not run" in run.out
    assert "error: STEPS_FAILED: 1 of 2 steps failed, 0 not run" in run.err
    settles(cluster3, "orders", "the move back", primary=before.primary)

    # STREAM=NODE pairs, --stop-on-error, --json: the step after the failure is not run.
    run = cli("cluster", "rebalance", "--json", "--stop-on-error", "missing=n1", "orders=n2")
    assert run.code == 1
    document = json.loads(run.out)
    assert (document["succeeded"], document["failed"]) == (0, 1)
    first, second = document["outcomes"]
    assert first["ran"] and not first["ok"]
    assert first["error"]["reason"] == "STREAM_NOT_FOUND"
    assert second["step"] == {"stream": "orders", "target": "n2"}
    assert not second["ran"] and not second["ok"]

    # migrate --pin: the new override is pinned at once.
    text = cli("stream", "migrate", "orders", target, "--pin").ok().out
    assert f"Primary:      {before.primary} -> {target}" in text
    assert "Pinned:       yes" in text
    settles(cluster3, "orders", "the pinned move", override_claimant=target, pinned=True)


def test_malformed_plan_on_a_cluster_exits_2_and_changes_nothing(
    cluster3: LocalCluster, cli: Cli
) -> None:
    cluster3.streams(1).CreateStream(
        streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name="still")),
        timeout=call_timeout_s,
    )
    before = route(cluster3, "still")
    target = next(node for node in before.replicas if node != before.primary)
    good_then_bad = json.dumps([{"stream": "still", "target": target}, {"stream": "still"}])
    run = cli("cluster", "rebalance", "--plan", "-", stdin=good_then_bad)
    assert run.code == 2
    assert run.err == "error: --plan stdin, step 2: 'target' must be a non-empty string, not None\n"
    assert run.out == ""
    run = cli("cluster", "rebalance", f"still={target}", "still")
    assert (run.code, run.err) == (2, "error: not a STREAM=NODE pair: 'still'\n")
    after = route(cluster3, "still")
    assert (after.primary, after.fence_epoch) == (before.primary, before.fence_epoch)
    assert after.override_claimant == ""


# ---------------------------------------------------------------------------------------------
# Without a node.


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ("[{", "--plan stdin is not JSON: "),
        ("[]", "--plan stdin has no steps"),
        ('{"steps": []}', "--plan stdin has no steps"),
        ('{"plan": []}', '--plan stdin: an object plan has exactly one key, "steps"'),
        ('"orders=n2"', "--plan stdin: expected a list of"),
        ('["orders=n2"]', "--plan stdin, step 1: expected {"),
        ('[{"stream": "a", "node": "n2"}]', "--plan stdin, step 1: unknown key 'node'"),
        ('[{"stream": "a", "target": ""}]', "--plan stdin, step 1: 'target' must be"),
        ('[{"stream": 7, "target": "n2"}]', "--plan stdin, step 1: 'stream' must be"),
        ('[{"stream": "a.b", "target": "n2"}]', "--plan stdin, step 1: stream name 'a.b'"),
    ],
)
def test_malformed_plans_exit_2_without_connecting(offline: Cli, plan: str, message: str) -> None:
    run = offline("cluster", "rebalance", "--plan", "-", stdin=plan)
    assert run.code == 2, run.err
    assert run.err.startswith(f"error: {message}")
    assert run.out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a=n2", "b"], "not a STREAM=NODE pair: 'b'"),
        (["=n2"], "not a STREAM=NODE pair: '=n2'"),
        (["a="], "not a STREAM=NODE pair: 'a='"),
        (["a=n2=n3"], "not a STREAM=NODE pair: 'a=n2=n3'"),
        (["a=n 2"], "pair 'a=n 2': node name 'n 2'"),
        ([], "nothing to do: give --plan FILE (or -) or STREAM=NODE pairs"),
        (["--plan", "-", "a=n2"], "give --plan FILE or STREAM=NODE pairs, not both"),
        (["--plan", "/nonexistent/plan.json"], "cannot read --plan /nonexistent/plan.json: "),
    ],
)
def test_bad_pairs_exit_2_without_connecting(offline: Cli, argv: list[str], message: str) -> None:
    run = offline("cluster", "rebalance", *argv, stdin="")
    assert run.code == 2, run.err
    assert run.err.startswith(f"error: {message}")


def test_a_plan_may_be_a_list_or_an_object_with_steps(tmp_path: Path) -> None:
    steps = [{"stream": "a", "target": "n2"}, {"stream": "b_2", "target": "n-3"}]
    expected = [
        cluster_pb2.RebalanceStep(stream="a", target="n2"),
        cluster_pb2.RebalanceStep(stream="b_2", target="n-3"),
    ]
    assert cli_cluster.parse_plan(json.dumps(steps)) == expected
    assert cli_cluster.parse_plan(json.dumps({"steps": steps})) == expected
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"steps": steps}))
    assert cli_cluster.plan_steps(str(plan), []) == expected
    assert cli_cluster.plan_steps(None, ["a=n2", "b_2=n-3"]) == expected
    with pytest.raises(UsageError, match="not both"):
        cli_cluster.plan_steps(str(plan), ["a=n2"])


def test_rebalance_table_shows_ok_errors_and_steps_not_run() -> None:
    answer = cluster_pb2.RebalanceStreamsResponse(succeeded=1, failed=1)
    answer.outcomes.add(
        step=cluster_pb2.RebalanceStep(stream="orders", target="n2"),
        ran=True,
        ok=True,
        result=cluster_pb2.MigrateStreamResponse(
            stream="orders", from_node="n1", to_node="n2", fence_epoch=3
        ),
    )
    failed = answer.outcomes.add(
        step=cluster_pb2.RebalanceStep(stream="gone", target="n2"), ran=True
    )
    failed.error.reason = "STREAM_NOT_FOUND"
    failed.error.message = "no stream named 'gone'"
    answer.outcomes.add(step=cluster_pb2.RebalanceStep(stream="later", target="n3"))
    assert cli_cluster.rebalance_text(answer).splitlines() == [
        "STEP  STREAM  TARGET  OUTCOME",
        "   1  orders  n2      ok: n1 -> n2, fence epoch 3",
        "   2  gone    n2      error: STREAM_NOT_FOUND: no stream named 'gone'",
        "   3  later   n3      not run",
        "",
        "1 succeeded, 1 failed, 1 not run",
    ]


def test_migrate_block_aligns_its_values() -> None:
    answer = cluster_pb2.MigrateStreamResponse(
        stream="orders",
        from_node="n1",
        to_node="n2",
        fence_epoch=4,
        epoch_start_seq=101,
        outcome="caught up, took over",
        attempts=1,
    )
    assert cli_cluster.migrate_text(answer, pinned=True).splitlines() == [
        "Stream orders",
        "  Primary:      n1 -> n2",
        "  Fence epoch:  4",
        "  Start seq:    101",
        "  Outcome:      caught up, took over",
        "  Attempts:     1",
        "  Pinned:       yes",
    ]
