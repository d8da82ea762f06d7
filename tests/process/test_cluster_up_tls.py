"""`raftlog cluster up --tls` through the CLI itself (issue 16 item 1), and `scripts/demo --tls`.

- `cluster up --tls --nodes 3` on free loopback ports makes a CA and certificates under the
  cluster directory and starts a TLS-only cluster: a plaintext client is refused, the CLI with
  `--tls-ca` of the generated CA creates a stream, publishes through another node (forwarded to
  the primary) and reads the message back through a third, and `cluster down` stops every node.
- `scripts/demo --tls --stop` runs the whole demo over TLS in a directory of its own, on free
  ports, and stops its cluster at the end.

Nodes are stopped by the pids `cluster up` recorded, in `finally` blocks too; every command has
a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.chaos.cluster import free_base_port
from raftlog.node.cli import certs, localcluster

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
cli_timeout_s = 90.0  # `cluster up` waits up to 60 s for Raft
demo_timeout_s = 180.0
refused_timeout_s = 3.0  # a refused handshake fails fast; this only bounds a hang
NODES = 3
# What a test must not inherit from the shell that runs it.
CLIENT_ENV = ("RAFTLOG_SERVER", "RAFTLOG_TOKEN", "RAFTLOG_SECRET_FILE", "RAFTLOG_TLS_CA",
              "RAFTLOG_TLS_CERT", "RAFTLOG_TLS_KEY")


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in CLIENT_ENV}, **extra}


def raftlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftlog.node.cli", *args],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=clean_env(), timeout=cli_timeout_s)


def json_of(completed: subprocess.CompletedProcess[str]) -> Any:
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def health_code(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = (grpc.insecure_channel(address) if credentials is None
               else grpc.secure_channel(address, credentials))
    with channel:
        # types-grpcio-health-checking declares HealthStub without its methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        try:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=refused_timeout_s)
        except grpc.RpcError as err:
            code: grpc.StatusCode = err.code()
            return code
    return grpc.StatusCode.OK


def _alive(pid: int) -> bool:
    return localcluster._cmdline(pid) is not None


def test_cluster_up_tls_refuses_plaintext_and_serves_clients_of_its_ca(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    base_port = free_base_port(localcluster.ports_per_node * NODES)
    try:
        started = raftlog("cluster", "up", "--tls", "--nodes", str(NODES), "--base-port",
                          str(base_port), "--data", str(data_dir), "--json")
        up = json_of(started)
        assert up["ready"], started.stderr
        ca = certs.paths_of(data_dir.resolve(), certs.CLIENT_NAME).ca
        assert ca.is_file() and f"--tls-ca {ca}" in started.stderr  # what a client needs
        n1, n2, n3 = (node["grpc_address"] for node in up["nodes"])
        pids = [node["pid"] for node in up["nodes"]]

        # Plaintext is refused, by gRPC and by the CLI; the same call over TLS is served.
        for address in (n1, n2, n3):
            assert health_code(address, None) == grpc.StatusCode.UNAVAILABLE
            trusted = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
            assert health_code(address, trusted) == grpc.StatusCode.OK
        plain = raftlog("--server", n1, "--timeout", "5s", "stream", "create", "orders",
                        "--subjects", "orders.>")
        assert plain.returncode == 1 and "cannot reach" in plain.stderr, plain.stderr

        tls = ["--tls-ca", str(ca)]
        created = raftlog(*tls, "--server", n1, "stream", "create", "orders", "--subjects",
                          "orders.>", "--replicas", "3")
        assert created.returncode == 0, created.stderr
        published = raftlog(*tls, "--server", n3, "pub", "orders", "orders.eu", '{"id": 1}')
        assert published.returncode == 0, published.stderr
        got = json_of(raftlog(*tls, "--server", n2, "stream", "get", "orders", "1", "--json"))
        assert (got["seq"], got["subject"], got["payload_text"]) == (1, "orders.eu", '{"id": 1}')
        assert raftlog("--server", n2, "stream", "get", "orders", "1").returncode == 1

        down = json_of(raftlog("cluster", "down", "--data", str(data_dir), "--json"))
        assert sorted(r["pid"] for r in down["stopped"]) == sorted(pids)
        assert not any(_alive(pid) for pid in pids)
    finally:
        localcluster.down(data_dir, timeout_s=localcluster.stop_timeout_s_default)


def stand_in_venv(tmp_path: Path) -> Path:
    """A RAFTLOG_VENV for scripts/env.sh: the running interpreter's bin directory behind an
    install stamp newer than pyproject.toml, so that sourcing it installs nothing."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "bin").symlink_to(Path(sys.executable).parent)
    stamp = venv / ".raftlog-installed"
    stamp.touch()
    later_s = (ROOT / "pyproject.toml").stat().st_mtime + 10 * 365 * 86400
    os.utime(stamp, (later_s, later_s))
    return venv


def test_the_demo_runs_over_tls(tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    base_port = free_base_port(localcluster.ports_per_node * NODES)
    env = clean_env(RAFTLOG_VENV=str(stand_in_venv(tmp_path)), RAFTLOG_DEMO_DIR=str(demo_dir),
                    RAFTLOG_DEMO_PORT=str(base_port))
    try:
        done = subprocess.run([str(ROOT / "scripts" / "demo"), "--tls", "--stop"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env=env, timeout=demo_timeout_s)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "installing" not in done.stderr and "creating" not in done.stderr
        out = done.stdout
        assert "$ raftlog cluster up --tls --nodes 3" in out, out
        assert f"$ export RAFTLOG_TLS_CA={demo_dir}/tls/ca.pem" in out, out
        assert '{"id": 1, "total": 12.50}' in out and '{"id": 3, "total": 99.90}' in out, out
        assert "$ raftlog cluster down" in out
        # The nodes served TLS (their start line names the certificate) and are gone.
        for i in range(1, NODES + 1):
            assert "(TLS, certificate serial" in (demo_dir / f"n{i}.log").read_text()
        assert not [s for s in localcluster.status(demo_dir) if s.alive]
    finally:
        localcluster.down(demo_dir, timeout_s=localcluster.stop_timeout_s_default)
