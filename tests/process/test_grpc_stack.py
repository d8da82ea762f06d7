"""A node process runs on the gRPC stack `grpc_stack` chooses, whichever way it is started, and
keeps an operator's own choice (node/cli/grpc_stack.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.chaos.nodeproc import NodeProcess, free_port, is_serving, wait_until
from raftlog.node.cli import grpc_stack

RAFTLOG_SCRIPT = Path(sys.executable).with_name("raftlog")
node_start_timeout_s = 30.0
node_stop_timeout_s = 10.0


def test_a_node_without_a_choice_gets_the_node_stack() -> None:
    environ = grpc_stack.node_environment({"PATH": "/bin"})
    assert environ == {"PATH": "/bin", "GRPC_EXPERIMENTS": grpc_stack.NODE_EXPERIMENTS}


@pytest.mark.parametrize("chosen", ["", "-event_engine_client", "event_engine_listener"])
def test_an_operators_choice_is_kept(chosen: str) -> None:
    assert grpc_stack.node_environment({"GRPC_EXPERIMENTS": chosen}) is None


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def _cmdline(pid: int) -> list[str]:
    return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if part]


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)


@pytest.mark.usefixtures("clean_environ")
def test_python_m_node_runs_on_the_node_stack(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "n").start()
    try:
        assert _environ(node.pid)["GRPC_EXPERIMENTS"] == grpc_stack.NODE_EXPERIMENTS
        assert _cmdline(node.pid)[1:4] == ["-m", "raftlog.node.cli", "node"]
    finally:
        node.cleanup()


def test_python_m_node_keeps_the_operators_choice(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")
    node = NodeProcess(tmp_path / "n").start()
    try:
        assert _environ(node.pid)["GRPC_EXPERIMENTS"] == ""
    finally:
        node.cleanup()


@pytest.fixture
def script_node(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`raftlog node` as a user types it (the console script), with no choice in its
    environment."""
    if not RAFTLOG_SCRIPT.exists():
        pytest.skip(f"no console script at {RAFTLOG_SCRIPT} (scripts/env.sh installs it)")
    address = f"127.0.0.1:{free_port()}"
    environ = {key: value for key, value in os.environ.items() if key != "GRPC_EXPERIMENTS"}
    log = tmp_path / "node.log"
    with log.open("ab") as log_file:
        process = subprocess.Popen(
            [str(RAFTLOG_SCRIPT), "node", "--data", str(tmp_path / "n"), "--grpc", address],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ)
    try:
        def serving() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"node exited: {log.read_text(errors='replace')[-4000:]}")
            return is_serving(address)

        wait_until(serving, node_start_timeout_s, what=f"node on {address} serving")
        yield process, address
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=node_stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=node_stop_timeout_s)


def test_the_console_script_node_reexecutes_itself_on_the_node_stack(
        script_node: tuple[subprocess.Popen[bytes], str]) -> None:
    process, _address = script_node
    # Same pid, now `python -m raftlog.node.cli node ...` with the choice in its environment.
    assert _environ(process.pid)["GRPC_EXPERIMENTS"] == grpc_stack.NODE_EXPERIMENTS
    assert _cmdline(process.pid)[1:4] == ["-m", "raftlog.node.cli", "node"]
    process.terminate()
    assert process.wait(timeout=node_stop_timeout_s) == 0
