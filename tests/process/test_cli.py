"""The `raftlog` CLI: parsing and rendering without a node, then every command against a real
node process (`node_proc`), run in-process through `main()` with stdout/stderr captured, plus
the console script and `scripts/bench --quick --no-peer` as subprocesses.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.nodeproc import NodeProcess, free_port
from raftlog.node.cli import format as fmt
from raftlog.node.cli.main import main
from raftlog.v1 import types_pb2

ROOT = Path(__file__).resolve().parents[2]
RAFTLOG_SCRIPT = Path(sys.executable).parent / "raftlog"
subprocess_timeout_s = 60
bench_timeout_s = 180


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


@pytest.fixture
def cli(node_proc: NodeProcess, capsys: pytest.CaptureFixture[str]) -> Any:
    """cli("stream", "ls") runs `raftlog --server <node> stream ls` in this process."""

    def run(*args: str, stdin: bytes | None = None) -> Run:
        if stdin is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        try:
            code = main(["--server", node_proc.address, *args])
        finally:
            sys.stdin = sys.__stdin__
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def publish(cli: Any, stream: str, subject: str, *payloads: str) -> list[int]:
    document = cli("pub", stream, subject, *payloads, "--json").json()
    return [ack["seq"] for ack in document["acks"]]


# ---------------------------------------------------------------------------------------------
# Without a node.


@pytest.mark.parametrize(
    ("text", "expected"),
    [("300", 300), ("64KB", 65536), ("10MB", 10 << 20), ("1GiB", 1 << 30), ("1.5k", 1536)],
)
def test_sizes_are_binary(text: str, expected: int) -> None:
    assert fmt.parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [("500ms", 500), ("30s", 30_000), ("2m", 120_000), ("1h30m", 5_400_000), ("1d", 86_400_000),
     ("1.5", 1500), ("0", 0)],
)
def test_durations_parse_to_ms(text: str, expected_ms: int) -> None:
    assert fmt.parse_duration_ms(text) == expected_ms


@pytest.mark.parametrize("text", ["", "1x", "m", "1h 2m", "-1s", "ten"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        fmt.parse_duration_ms(text)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(250, "250ms"), (1500, "1.5s"), (30_000, "30s"), (120_000, "2m"), (5_400_000, "1h30m")],
)
def test_durations_render_for_people(ms: int, text: str) -> None:
    assert fmt.human_duration_ms(ms) == text


def test_times_accept_iso8601_and_epoch_ms() -> None:
    assert fmt.parse_time_ms("2026-11-22T10:00:00Z") == 1_795_341_600_000
    assert fmt.parse_time_ms("1795341600000") == 1_795_341_600_000
    with pytest.raises(ValueError, match="not a time"):
        fmt.parse_time_ms("yesterday")


def test_table_columns_align_and_numbers_align_right() -> None:
    table = fmt.render_table(("NAME", "COUNT"), [("a", 5), ("longer", 1234)], right_align=(1,))
    assert table.splitlines() == ["NAME    COUNT", "a           5", "longer   1234"]


def test_payloads_print_as_text_or_base64() -> None:
    assert fmt.payload_text(b"hello") == "hello"
    assert fmt.payload_text(b"\xff\x00") == "base64:/wA="
    assert fmt.decode_payload_arg("base64:/wA=") == b"\xff\x00"


def test_json_keeps_proto_names_numbers_and_adds_payload_text() -> None:
    message = types_pb2.Message(seq=7, subject="a.b", payload=b"hi", deliver_count=2)
    document = fmt.proto_dict(message)
    assert document["seq"] == 7 and document["deliver_count"] == 2
    assert document["payload"] == "aGk=" and document["payload_text"] == "hi"
    assert document["headers"] == []


@pytest.mark.parametrize(
    "argv",
    [[], ["stream"], ["stream", "create"], ["stream", "create", "s", "--max-age", "soon"],
     ["pub", "s", "a", "--count", "0"], ["--server", "nohost", "stream", "ls"]],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err


def test_unreachable_server_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert main(["stream", "ls", "--server", address, "--timeout", "3s"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach {address}" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Streams.


def test_stream_lifecycle(cli: Any) -> None:
    created = cli("stream", "create", "orders", "--subjects", "orders.>,audit.*",
                  "--max-age", "1h", "--max-bytes", "10MB", "--dedupe-window", "2m",
                  "--replicas", "1", "--description", "demo", "--json").json()
    config = created["config"]
    assert config["name"] == "orders" and config["subjects"] == ["orders.>", "audit.*"]
    assert config["max_age_ms"] == 3_600_000 and config["max_bytes"] == 10 << 20
    assert config["dedupe_window_ms"] == 120_000 and config["description"] == "demo"

    publish(cli, "orders", "orders.eu", "a", "b", "c")
    info = cli("stream", "info", "orders")
    assert info.code == 0 and "Stream orders" in info.out and "Max age:" in info.out
    assert cli("stream", "info", "orders", "--json").json()["state"]["messages"] == 3

    listing = cli("stream", "ls")
    assert listing.code == 0
    header, row = listing.out.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "SUBJECTS", "RETENTION"]
    assert row.startswith("orders") and "limits" in row
    names = [s["config"]["name"] for s in cli("stream", "ls", "--json").json()["streams"]]
    assert names == ["orders"]
    assert cli("stream", "ls", "--prefix", "zzz", "--json").json()["streams"] == []

    updated = cli("stream", "update", "orders", "--max-msgs", "2", "--json").json()
    assert updated["pruned"] == 1 and updated["info"]["state"]["messages"] == 2
    assert updated["info"]["config"]["max_age_ms"] == 3_600_000  # untouched fields stay

    assert cli("stream", "purge", "orders", "--json").json()["purged"] == 2
    assert cli("stream", "info", "orders", "--json").json()["state"]["messages"] == 0

    assert cli("stream", "rm", "orders", "--force", "--json").json() == {"deleted": "orders"}
    gone = cli("stream", "info", "orders")
    assert gone.code == 1 and "error: STREAM_NOT_FOUND:" in gone.err


def test_update_replaces_subjects_and_needs_a_change(cli: Any) -> None:
    cli("stream", "create", "s1", "--subjects", "a.>").ok()
    updated = cli("stream", "update", "s1", "--subjects", "b.>,c", "--json").json()
    assert updated["info"]["config"]["subjects"] == ["b.>", "c"]
    nothing = cli("stream", "update", "s1")
    assert nothing.code == 2 and "nothing to change" in nothing.err


def test_rm_without_force_is_refused_when_nobody_can_confirm(cli: Any) -> None:
    cli("stream", "create", "keep").ok()
    refused = cli("stream", "rm", "keep", stdin=b"y\n")
    assert refused.code == 2 and "--force" in refused.err
    assert cli("stream", "info", "keep").code == 0


def test_purge_by_subject_and_below_seq(cli: Any) -> None:
    cli("stream", "create", "p").ok()
    publish(cli, "p", "x", "1", "2", "3")
    publish(cli, "p", "y", "4", "5")
    assert cli("stream", "purge", "p", "--subject", "y", "--keep", "1", "--json").json() == {
        "purged": 1
    }
    assert cli("stream", "purge", "p", "--below-seq", "3", "--json").json()["purged"] == 2
    assert cli("stream", "info", "p", "--json").json()["state"]["messages"] == 2


def test_direct_reads(cli: Any) -> None:
    cli("stream", "create", "r").ok()
    publish(cli, "r", "k.1", "first", "second")
    publish(cli, "r", "k.2", "third")
    got = cli("stream", "get", "r", "2")
    assert got.code == 0 and got.out.startswith("#2  k.1") and "second" in got.out
    assert cli("stream", "last", "r", "k.1", "--json").json()["payload_text"] == "second"
    subjects = cli("stream", "subjects", "r", "--json").json()["subjects"]
    assert [(s["subject"], s["messages"]) for s in subjects] == [("k.1", 2), ("k.2", 1)]
    assert "k.1" in cli("stream", "subjects", "r", "--prefix", "k.").out
    scan = cli("stream", "scan", "r", "k.1", "--limit", "1", "--json").json()
    assert [m["seq"] for m in scan["messages"]] == [1] and scan["next_seq"] == 2
    missing = cli("stream", "get", "r", "99")
    assert missing.code == 1 and "error: MESSAGE_NOT_FOUND:" in missing.err


# ---------------------------------------------------------------------------------------------
# Publishing.


def test_pub_from_args_and_stdin(cli: Any) -> None:
    cli("stream", "create", "in").ok()
    text = cli("pub", "in", "a", "one", "two")
    assert text.code == 0 and text.out.splitlines() == [
        "#1 a", "#2 a", "published 2 messages to in"
    ]
    document = cli("pub", "in", "b", "--json", stdin=b"three\nfour\r\n\nfive").json()
    assert [ack["seq"] for ack in document["acks"]] == [3, 4, 5, 6]
    assert document["published"] == 4 and document["failed"] == 0
    payloads = [cli("stream", "get", "in", str(seq), "--json").json()["payload_text"]
                for seq in (3, 4, 5, 6)]
    assert payloads == ["three", "four", "", "five"]


def test_pub_headers_msg_id_and_binary(cli: Any) -> None:
    cli("stream", "create", "h").ok()
    first = cli("pub", "h", "s", "base64:/wA=", "-H", "k=v=w", "-H", "k=2", "--msg-id", "m1",
                "--json").json()
    again = cli("pub", "h", "s", "other", "--msg-id", "m1", "--json").json()
    assert again["acks"][0] == {**first["acks"][0], "duplicate": True}
    assert again["duplicates"] == 1 and again["published"] == 0
    message = cli("stream", "get", "h", "1", "--json").json()
    assert message["payload"] == "/wA=" and "payload_text" not in message
    assert message["headers"] == [{"key": "k", "value": "v=w"}, {"key": "k", "value": "2"}]
    assert message["msg_id"] == "m1"
    shown = cli("stream", "get", "h", "1").out
    assert "k: v=w" in shown and "base64:/wA=" in shown


def test_pub_takes_payloads_after_options_and_after_dashes(cli: Any) -> None:
    cli("stream", "create", "mix").ok()
    document = cli("pub", "mix", "s", "one", "-H", "k=v", "two", "--json", "--", "-3").json()
    assert document["published"] == 3
    payloads = [cli("stream", "get", "mix", str(seq), "--json").json()["payload_text"]
                for seq in (1, 2, 3)]
    assert payloads == ["one", "two", "-3"]
    assert cli("stream", "ls", "stray").code == 2


def test_pub_expectations_chain_and_report_the_reason(cli: Any) -> None:
    cli("stream", "create", "e").ok()
    assert cli("pub", "e", "s", "a", "b", "--expect-last-seq", "0").code == 0
    stale = cli("pub", "e", "s", "c", "--expect-last-seq", "1")
    assert stale.code == 1 and "error: WRONG_LAST_SEQ:" in stale.err
    ok = cli("pub", "e", "s", "c", "--expect-last-subject-seq", "2", "--json").json()
    assert [ack["seq"] for ack in ok["acks"]] == [3]
    assert cli("stream", "info", "e", "--json").json()["state"]["last_seq"] == 3


def test_pub_errors_name_the_reason(cli: Any) -> None:
    cli("stream", "create", "only", "--subjects", "only.>").ok()
    wrong = cli("pub", "only", "elsewhere", "x")
    assert wrong.code == 1 and "error: SUBJECT_NOT_IN_STREAM:" in wrong.err
    unknown = cli("pub", "nope", "a", "x", "--json")
    assert unknown.code == 1 and "STREAM_NOT_FOUND" in unknown.err
    bad = cli("stream", "create", "bad/name")
    assert bad.code == 1 and "error: INVALID_NAME:" in bad.err


def test_pub_load_mode(cli: Any) -> None:
    cli("stream", "create", "load").ok()
    batch = cli("pub", "load", "l", "--count", "250", "--size", "64", "--batch", "100",
                "--concurrency", "2", "--json").json()
    assert batch["msgs"] == 250 and batch["msgs_per_s"] > 0 and batch["p99_ms"] > 0
    unary = cli("pub", "load", "l", "--count", "20", "--size", "16")
    assert unary.code == 0 and "msgs/s" in unary.out and "p50" in unary.out
    assert cli("stream", "info", "load", "--json").json()["state"]["messages"] == 270


# ---------------------------------------------------------------------------------------------
# Consumers.


def test_consumer_lifecycle(cli: Any) -> None:
    cli("stream", "create", "c", "--subjects", "c.>").ok()
    created = cli("consumer", "create", "c", "worker", "--filter", "c.eu.*", "--ack-wait", "5s",
                  "--max-deliver", "3", "--backoff", "1s,5s", "--max-ack-pending", "10",
                  "--dead-letter", "c.dead", "--description", "d", "--json").json()
    config = created["config"]
    assert config["filter_subject"] == "c.eu.*" and config["ack_wait_ms"] == 5000
    assert config["backoff_ms"] == [1000, 5000] and config["max_deliver"] == 3
    from_seq = cli("consumer", "create", "c", "late", "--start-seq", "5", "--json").json()
    assert from_seq["config"]["deliver_policy"] == "DELIVER_POLICY_BY_START_SEQ"

    listing = cli("consumer", "ls", "c")
    assert listing.out.splitlines()[0].split()[:3] == ["NAME", "FILTER", "DELIVER"]
    names = sorted(i["config"]["name"] for i in cli("consumer", "ls", "c", "--json").json()[
        "consumers"])
    assert names == ["late", "worker"]
    info = cli("consumer", "info", "c", "worker")
    assert info.code == 0 and "Consumer c > worker" in info.out and "Ack wait:" in info.out

    assert cli("consumer", "rm", "c", "late", "--json").json() == {"deleted": "late", "stream": "c"}
    gone = cli("consumer", "info", "c", "late")
    assert gone.code == 1 and "error: CONSUMER_NOT_FOUND:" in gone.err
    conflicting = cli("consumer", "create", "c", "x", "--deliver", "new", "--start-seq", "2")
    assert conflicting.code == 2


def test_fetch_acks_so_a_second_fetch_gets_nothing(cli: Any) -> None:
    cli("stream", "create", "f").ok()
    publish(cli, "f", "s", "a", "b", "c")
    cli("consumer", "create", "f", "w").ok()
    fetched = cli("fetch", "f", "w", "--batch", "10", "--wait", "0", "--json").json()
    assert [m["payload_text"] for m in fetched["messages"]] == ["a", "b", "c"]
    assert [m["deliver_count"] for m in fetched["messages"]] == [1, 1, 1]
    assert fetched["acked"] == 3
    assert cli("fetch", "f", "w", "--wait", "0", "--json").json()["messages"] == []
    state = cli("consumer", "info", "f", "w", "--json").json()["state"]
    assert state["ack_floor"] == 3 and state["num_ack_pending"] == 0
    text = cli("fetch", "f", "w", "--wait", "100ms")
    assert text.code == 0 and "no messages" in text.out


def test_fetch_no_ack_leaves_messages_pending(cli: Any) -> None:
    cli("stream", "create", "n").ok()
    publish(cli, "n", "s", "a", "b")
    cli("consumer", "create", "n", "w").ok()
    fetched = cli("fetch", "n", "w", "--no-ack", "--wait", "0", "--json").json()
    assert len(fetched["messages"]) == 2 and fetched["acked"] == 0
    state = cli("consumer", "info", "n", "w", "--json").json()["state"]
    assert state["num_ack_pending"] == 2 and state["ack_floor"] == 0


def test_sub_prints_and_acks_until_count(cli: Any) -> None:
    cli("stream", "create", "sb").ok()
    publish(cli, "sb", "s", "a", "b", "c")
    cli("consumer", "create", "sb", "w").ok()
    two = cli("sub", "sb", "w", "--count", "2", "--json").json()
    assert [m["payload_text"] for m in two["messages"]] == ["a", "b"] and two["acked"] == 2
    assert two["stopped"] == "received 2 messages"
    assert cli("consumer", "info", "sb", "w", "--json").json()["state"]["ack_floor"] == 2


def test_sub_stops_when_empty_having_acked_everything(cli: Any) -> None:
    cli("stream", "create", "se").ok()
    publish(cli, "se", "s", "a", "b", "c")
    cli("consumer", "create", "se", "w").ok()
    run = cli("sub", "se", "w", "--stop-when-empty", "--batch", "2")
    assert run.code == 0 and "#3  s" in run.out and "3 messages, 3 acked" in run.err
    state = cli("consumer", "info", "se", "w", "--json").json()["state"]
    assert state["ack_floor"] == 3 and state["num_ack_pending"] == 0
    empty = cli("sub", "se", "w", "--stop-when-empty", "--json").json()
    assert empty["messages"] == [] and empty["acked"] == 0


def test_health(cli: Any) -> None:
    assert cli("health", "--json").json()["status"] == "SERVING"


# ---------------------------------------------------------------------------------------------
# As a user runs it.


def run_script(*args: str, server: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAFTLOG_SERVER": server}
    return subprocess.run([str(RAFTLOG_SCRIPT), *args], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=subprocess_timeout_s, check=False)


def test_console_script_end_to_end(node_proc: NodeProcess) -> None:
    server = node_proc.address
    assert run_script("stream", "create", "cs", server=server).returncode == 0
    published = subprocess.run(
        [str(RAFTLOG_SCRIPT), "pub", "cs", "x", "--json"], input="l1\nl2\n", capture_output=True,
        text=True, env={**os.environ, "RAFTLOG_SERVER": server}, timeout=subprocess_timeout_s,
        check=False,
    )
    assert json.loads(published.stdout)["published"] == 2, published.stderr
    refused = run_script("stream", "rm", "cs", server=server)
    assert refused.returncode == 2 and "--force" in refused.stderr
    listing = run_script("stream", "ls", "--json", server=server)
    assert json.loads(listing.stdout)["streams"][0]["state"]["messages"] == 2


def test_bench_quick_prints_one_json_document() -> None:
    """About 12 s on 2 cores, so not marked slow."""
    completed = subprocess.run(
        [str(ROOT / "scripts" / "bench"), "--quick", "--no-peer"], capture_output=True,
        text=True, timeout=bench_timeout_s, stdin=subprocess.DEVNULL, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    document = json.loads(completed.stdout)
    assert document["schema"] == "raftlog-bench/1" and document["jetstream"] is None
    raftlog = document["raftlog"]
    figures = [
        raftlog["unary_publish"]["callers_1"], raftlog["unary_publish"]["callers_8"],
        raftlog["batch_publish"]["batch_100"], raftlog["batch_publish"]["batch_1000"],
        raftlog["stream_publish"], raftlog["frames_publish"], raftlog["fetch_ack"]["batch_100"],
        raftlog["fetch_ack"]["batch_1000"], raftlog["fetch_carried"]["batch_100"],
        raftlog["fetch_carried"]["batch_1000"],
    ]
    for figure in figures:
        assert figure["msgs"] > 0 and figure["msgs_per_s"] > 0 and figure["error"] is None
    assert raftlog["unary_publish"]["callers_1"]["p99_ms"] >= raftlog["unary_publish"][
        "callers_1"]["p50_ms"] > 0
    assert set(document["ratios"]) >= {"batch_1000_vs_publish_async",
                                       "fetch_ack_100_vs_pull_consume",
                                       "fetch_carried_100_vs_pull_consume",
                                       "unary_p50_vs_sync_publish_p50"}
    assert "raftlog single node" in completed.stderr
    steps = raftlog["unary_breakdown"]
    assert steps["health_p50_ms"] > 0 and steps["publish_r1_p50_ms"] > 0
    assert document["targets"]["unary_p50_ms"]["raftlog"] == raftlog["unary_publish"][
        "callers_1"]["p50_ms"]
    assert document["meta"]["repeat"] == 1 and document["runs"] is None
    assert document["spread"]["fetch_ack_100_msgs_per_s"]["median"] == raftlog["fetch_ack"][
        "batch_100"]["msgs_per_s"]
    floor = document["grpc_floor"]
    for shape in ("unary_1", "unary_8", "client_streaming", "bidi_window"):
        assert floor[shape]["per_s"] > 0 and floor[shape]["ceiling_per_s"] > 0, floor
        assert floor[shape]["client_cpu_us"] > 0 and floor[shape]["server_cpu_us"] > 0, floor
    assert "bare grpc.aio on this machine" in completed.stderr
