"""A local Spark standalone cluster (one master, N workers) from the installed pyspark's
`spark-class`: no download, loopback only, every port chosen free, the REST submission server
disabled (and moved off 6066 in case a setting turns it back on).

`up` starts the JVMs, records them in DIR/cluster.json and returns once every worker has
registered with the master; `down` stops exactly the recorded processes (checking that each
pid still runs a Spark daemon of this directory before signalling it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyspark

STATE_FILE = "cluster.json"
PROPERTIES_FILE = "spark-defaults.conf"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
registered_wait_s = 90.0  # until every worker shows as ALIVE on the master
stop_wait_s = 15.0  # after SIGTERM, before SIGKILL
poll_interval_s = 0.25
cmdline_reads_max = 8
daemon_memory_mb = 256  # heap of the master and worker daemons themselves
worker_memory_mb = 2_048  # what a worker offers its executors
LOOPBACK = "127.0.0.1"

# The daemons this process started, by pid: kept so they are reaped (and not reported as
# leaked) when `down` runs in the same process as `up`.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ClusterError(Exception):
    """The cluster could not be started, found or stopped; `str(error)` says why."""


@dataclass
class ClusterState:
    directory: str
    master_url: str
    web_url: str
    pids: dict[str, int] = field(default_factory=dict)  # "master", "worker-1", ...
    ports: dict[str, int] = field(default_factory=dict)

    def write(self) -> None:
        path = Path(self.directory) / STATE_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n",
                        encoding="utf-8")

    @classmethod
    def read(cls, directory: Path) -> ClusterState:
        path = directory / STATE_FILE
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError as error:
            raise ClusterError(f"{directory}: no cluster recorded ({STATE_FILE} missing)"
                               ) from error


def spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def up(directory: Path, *, workers: int = 1, port: int | None = None, cores: int = 2
       ) -> ClusterState:
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / STATE_FILE).exists():
        state = ClusterState.read(directory)
        if any(_ours(pid, directory) for pid in state.pids.values()):
            raise ClusterError(f"a cluster is already up at {state.master_url} ({directory})")
    ports = {"master": port or free_port(), "master_web": free_port(), "rest": free_port()}
    properties = directory / PROPERTIES_FILE
    properties.write_text(
        "spark.master.rest.enabled false\n"
        f"spark.master.rest.port {ports['rest']}\n"
        f"spark.master.rest.host {LOOPBACK}\n", encoding="utf-8")
    url = f"spark://{LOOPBACK}:{ports['master']}"
    state = ClusterState(str(directory), url, f"http://{LOOPBACK}:{ports['master_web']}",
                         ports=ports)
    try:
        state.pids["master"] = _start(directory, "master", [
            MASTER_CLASS, "--host", LOOPBACK, "--port", str(ports["master"]),
            "--webui-port", str(ports["master_web"]), "--properties-file", str(properties)])
        state.write()
        for index in range(1, workers + 1):
            name = f"worker-{index}"
            ports[f"{name}"], ports[f"{name}_web"] = free_port(), free_port()
            work = directory / name
            work.mkdir(exist_ok=True)
            state.pids[name] = _start(directory, name, [
                WORKER_CLASS, url, "--host", LOOPBACK, "--port", str(ports[name]),
                "--webui-port", str(ports[f"{name}_web"]), "--cores", str(cores),
                "--memory", f"{worker_memory_mb}m", "--work-dir", str(work),
                "--properties-file", str(properties)])
            state.write()
        _wait_registered(state, workers)
    except BaseException:
        down(directory)
        raise
    return state


def down(directory: Path) -> list[str]:
    """Stops the recorded processes (workers first); returns what it did, one line each."""
    directory = directory.resolve()
    state = ClusterState.read(directory)
    done: list[str] = []
    for name, pid in sorted(state.pids.items(), key=lambda item: item[0] == "master"):
        if not _ours(pid, directory):
            done.append(f"{name} (pid {pid}): not running")
            continue
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, stop_wait_s):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, stop_wait_s)
            done.append(f"{name} (pid {pid}): killed")
        else:
            done.append(f"{name} (pid {pid}): stopped")
    (directory / STATE_FILE).unlink(missing_ok=True)
    return done


def _start(directory: Path, name: str, arguments: list[str]) -> int:
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    home = spark_home()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP=LOOPBACK,
               SPARK_LOG_DIR=str(logs), SPARK_DAEMON_MEMORY=f"{daemon_memory_mb}m",
               SPARK_CONF_DIR=str(directory))
    with open(logs / f"{name}.log", "ab") as log:
        process = subprocess.Popen(  # spark-class execs java: the pid is the JVM's
            [str(home / "bin" / "spark-class"), *arguments], stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    _children[process.pid] = process
    return process.pid


def _ours(pid: int, directory: Path) -> bool:
    """Does `pid` run a Spark master or worker started for `directory`? A child of this
    process is asked directly; another process's by its command line (read again while it is
    empty: a process in the middle of an exec shows none)."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    for _ in range(cmdline_reads_max):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        if command:
            break
        time.sleep(poll_interval_s)
    text = [part.decode(errors="replace") for part in command.split(b"\0")]
    spark_daemon = MASTER_CLASS in text or WORKER_CLASS in text
    return spark_daemon and str(directory / PROPERTIES_FILE) in text and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] == "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    child = _children.get(pid)
    if child is not None:
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        del _children[pid]
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # started by another process: watch /proc
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return True
        time.sleep(poll_interval_s)
    return False


def _wait_registered(state: ClusterState, workers: int) -> None:
    deadline = time.monotonic() + registered_wait_s
    alive = 0
    while time.monotonic() < deadline:
        for name, pid in state.pids.items():
            if not _ours(pid, Path(state.directory)):
                raise ClusterError(f"{name} exited while starting; see "
                                   f"{state.directory}/logs/{name}.log")
        try:
            with urllib.request.urlopen(f"{state.web_url}/json/", timeout=5) as answer:
                status = json.loads(answer.read())
            alive = sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")
            if alive >= workers:
                return
        except (urllib.error.URLError, OSError, ValueError):
            pass  # the master's web UI is not up yet
        time.sleep(poll_interval_s)
    raise ClusterError(f"{alive} of {workers} workers registered with {state.master_url} "
                       f"within {registered_wait_s:.0f} s; see {state.directory}/logs")
