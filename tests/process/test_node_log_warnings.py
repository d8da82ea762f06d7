"""Issue 16 items 1 and 6 in a real `raftlog node` process: a plaintext client port on an
address other machines could reach is warned about, a loopback one is not; and repeated
identical log lines of a running node are rate limited (node/log_limit.py): a flood of
malformed requests writes at most `log_repeats_max` warning lines, then, once the window has
ended, one summary line with the number it suppressed.

The warning is checked without listening beyond loopback: the node is given a non-loopback
address this machine does not hold (a documentation range, RFC 5737), so its own check on the
configured address runs and the bind that follows fails (the node exits with INVALID_CONFIG);
nothing is ever reachable from the network.
"""

from __future__ import annotations

import errno
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.nodeproc import NodeProcess, wait_until
from raftlog.node import log_limit
from raftlog.node.transport import rpc

call_timeout_s = 10.0
# The limiter's window on the node under test (limits.log_repeat_window_s, 60 s, by default):
# long enough for the flood to run inside it on a loaded machine.
repeat_window_s = 8.0
exit_timeout_s = 60.0
WARNING = "is plaintext: anyone on the network can read and send its calls"
# Not this machine's (checked first): TEST-NET-3, TEST-NET-2, TEST-NET-1.
UNHELD_HOSTS = ("203.0.113.7", "198.51.100.7", "192.0.2.7")
MALFORMED = "malformed request to"
PUBLISH = "/raftlog.v1.Streams/Publish"
GARBAGE = b"\xff" * 11  # a varint tag longer than 10 bytes: no message parses it


def unheld_host() -> str:
    """A non-loopback IPv4 address no interface of this machine holds (binding it fails)."""
    for host in UNHELD_HOSTS:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, 0))
            except OSError as err:
                if err.errno == errno.EADDRNOTAVAIL:
                    return host
                raise
    pytest.skip(f"this machine holds every one of {UNHELD_HOSTS}")


def test_a_plaintext_port_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    address = f"{unheld_host()}:7400"
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", "node", "--data", str(tmp_path / "n1"),
         "--grpc", address], capture_output=True, text=True, timeout=exit_timeout_s,
        stdin=subprocess.DEVNULL, check=False)
    output = done.stdout + done.stderr
    warnings = [line for line in output.splitlines() if WARNING in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], output
    assert f"the client port on {address}" in warnings[0], warnings
    # Nothing listened: the bind failed and the node said so, without a traceback.
    assert done.returncode == 1, output
    assert f"INVALID_CONFIG: cannot listen on {address}" in output, output
    assert "Traceback" not in output, output


@pytest.fixture
def node_proc(tmp_path: Path) -> Iterator[NodeProcess]:
    node = NodeProcess(tmp_path / "node",
                       extra_args=("--log-repeat-window", str(repeat_window_s)))
    try:
        yield node.start()
    finally:
        node.stop()
        node.cleanup()


def send_garbage(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(PUBLISH, request_serializer=None, response_deserializer=None)(
            GARBAGE, timeout=call_timeout_s)
    parsed = rpc.from_rpc_error(caught.value)  # type: ignore[arg-type]
    assert parsed is not None and parsed.reason is Reason.MALFORMED_REQUEST, caught.value


def test_repeated_lines_of_a_running_node_are_rate_limited(node_proc: NodeProcess) -> None:
    """Loopback: no plaintext warning. A flood of one malformed request: at most
    `log_repeats_max` lines of it; after the window, the next one brings the summary of the
    rest (written when a record reaches the handler after the window ended)."""
    flood = limits.log_repeats_max * 20
    started_s = time.monotonic()
    with node_proc.channel() as channel:
        for _ in range(flood):
            send_garbage(channel)
        log = node_proc.log_text()
        assert WARNING not in log, log[-4000:]
        written = log.count(MALFORMED)
        assert written == limits.log_repeats_max, log[-4000:]
        summary = re.compile(r"suppressed (\d+) more lines like '(malformed request to [^']*)'")
        assert not summary.search(log), log[-4000:]
        # The window (--log-repeat-window) runs from the first line of the flood.
        time.sleep(max(0.0, repeat_window_s - (time.monotonic() - started_s)))

        polls = 0

        def summarised() -> bool:
            nonlocal polls
            polls += 1
            send_garbage(channel)
            return summary.search(node_proc.log_text()) is not None

        wait_until(summarised, 30, interval_s=1.0, what="the limiter's summary line")
    found = summary.search(node_proc.log_text())
    assert found is not None
    # The flood's lines past the budget, and the polls that came before the window ended.
    suppressed = int(found.group(1))
    assert flood - limits.log_repeats_max <= suppressed < flood - limits.log_repeats_max + polls
    assert found.group(2).startswith(MALFORMED) and log_limit.SUMMARY_TEMPLATE.startswith(
        "suppressed %d more lines like %r")
