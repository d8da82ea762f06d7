"""Start a Toxiproxy server for a test or a chaos run: `toxiproxy-server` from PATH when it is
there, else the bundled one (`python -m raftlog.chaos.toxiproxy`), each in a subprocess bound to
a loopback address, ready (GET /version answers) when `start_toxiproxy` returns.

The handle ends only the process it started, by pid: SIGTERM, then SIGKILL after
`stop_s_max`.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import shutil
import subprocess
import sys
import tempfile
import time
from types import TracebackType
from typing import IO

from raftlog.base import children

binary_name = "toxiproxy-server"
start_s_max = 20.0  # from spawning the process until /version answers
stop_s_max = 10.0  # SIGTERM to exit, then SIGKILL
probe_s_max = 1.0  # one /version request while waiting for the server
probe_interval_s = 0.05
log_tail_bytes_max = 4096  # of the server's output, quoted when it fails to start


class ToxiproxyProcess:
    """A running Toxiproxy server process: its API address, and `stop()`."""

    def __init__(self, *, host: str, port: int, process: subprocess.Popen[bytes],
                 bundled: bool, log: IO[bytes]) -> None:
        self.host = host
        self.port = port
        self.process = process
        self.bundled = bundled  # True: the asyncio server of this package
        self._log = log
        self._final_output = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def output(self) -> str:
        """The last `log_tail_bytes_max` bytes the server wrote to stdout and stderr."""
        if self._log.closed:
            return self._final_output
        self._log.flush()
        self._log.seek(0, 2)
        size = self._log.tell()
        self._log.seek(max(0, size - log_tail_bytes_max))
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        children.end(self.process, timeout_s=stop_s_max)
        if not self._log.closed:
            self._final_output = self.output()
            self._log.close()

    def __enter__(self) -> ToxiproxyProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def start_toxiproxy(host: str = "127.0.0.1", port: int = 8474, *,
                    use_binary: bool = True) -> ToxiproxyProcess:
    """A Toxiproxy server answering on host:port (a loopback address; port must be free and
    non-zero). `use_binary=False` always runs the bundled server."""
    if port <= 0:
        raise ValueError("start_toxiproxy needs a concrete port")
    if not _is_loopback(host):
        raise ValueError(f"Toxiproxy binds loopback only, not {host!r}")
    binary = shutil.which(binary_name) if use_binary else None
    if binary is not None:
        command = [binary, "-host", host, "-port", str(port)]
    else:
        command = [sys.executable, "-m", "raftlog.chaos.toxiproxy", "--host", host,
                   "--port", str(port)]
    log = tempfile.TemporaryFile()  # noqa: SIM115 -- the handle owns and closes it
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    handle = ToxiproxyProcess(host=host, port=port, process=process, bundled=binary is None,
                              log=log)
    try:
        _wait_ready(handle)
    except BaseException:
        output = handle.output()
        handle.stop()
        raise RuntimeError(f"{command[0]} did not start on {host}:{port}:\n{output}") from None
    return handle


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _wait_ready(handle: ToxiproxyProcess) -> None:
    deadline = time.monotonic() + start_s_max
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(f"exited with status {handle.process.returncode}")
        if _answers_version(handle.host, handle.port):
            return
        time.sleep(probe_interval_s)
    raise TimeoutError(f"no answer to /version within {start_s_max} s")


def _answers_version(host: str, port: int) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=probe_s_max)
    with contextlib.closing(connection):
        try:
            connection.request("GET", "/version")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
