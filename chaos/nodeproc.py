"""Real `raftlog node` processes for tests and chaos runs: loopback ports, tmp data dirs,
bounded waits, and cleanup that ends only the processes a test started (by pid)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

start_timeout_s = 30.0
stop_timeout_s = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], bool], timeout_s: float, *, interval_s: float = 0.05,
               what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s} s")


def is_serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        # types-grpcio-health-checking declares HealthStub without its methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class NodeProcess:
    def __init__(self, data_dir: Path, *, port: int | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> NodeProcess:
        command = [sys.executable, "-m", "raftlog.node.cli", "node", "--data", str(self.data_dir),
                   "--grpc", self.address, *self.extra_args]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log_file.close()
        try:
            wait_until(lambda: self._alive() and is_serving(self.address), start_timeout_s,
                       what=f"node on {self.address} serving")
        except TimeoutError:
            self.kill9()
            raise RuntimeError(f"node did not start; log:\n{self.log_text()[-4000:]}") from None
        return self

    def _alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"node exited; log:\n{self.log_text()[-4000:]}")
        return True

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=stop_timeout_s)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after stop_timeout_s; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode

    def restart(self) -> NodeProcess:
        self.stop()
        return self.start()

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.kill9()
