"""The audit on a local Spark standalone cluster (`raftlog audit cluster up|down`), and as a
script given to spark-submit. Each starts JVMs of its own (master, worker, executor, driver):
the full runs are `slow`; the default suite keeps the cluster's up and down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from argparse import Namespace
from pathlib import Path

import pytest

from raftlog.audit import cli_cluster, cli_run, standalone
from tests.audit.frames import clean_stream

JOB_MAIN = Path(cli_run.__file__).with_name("job_main.py")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cluster_up_registers_its_worker_on_loopback_and_down_stops_exactly_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "cluster"
    args = Namespace(action="up", dir=directory, workers=1, cores=1, port=None)
    assert cli_cluster.run(args) == 0
    try:
        url = capsys.readouterr().out.strip()
        state = standalone.ClusterState.read(directory)
        assert url == state.master_url and url.startswith("spark://127.0.0.1:")
        with urllib.request.urlopen(f"{state.web_url}/json/", timeout=10) as answer:
            status = json.loads(answer.read())
        assert [w["state"] for w in status["workers"]] == ["ALIVE"]
        assert all(w["host"] == "127.0.0.1" for w in status["workers"])
        assert "spark.master.rest.enabled false" in (
            directory / standalone.PROPERTIES_FILE).read_text()
        assert all(_alive(pid) for pid in state.pids.values())
        assert cli_cluster.run(Namespace(**{**vars(args), "action": "up"})) == 1  # already up
    finally:
        assert cli_cluster.run(Namespace(**{**vars(args), "action": "down"})) == 0
    assert not any(_alive(pid) for pid in state.pids.values())
    assert not (directory / standalone.STATE_FILE).exists()


@pytest.mark.slow
def test_an_audit_runs_on_the_standalone_cluster(tmp_path: Path) -> None:
    root = clean_stream(last_seq=20).write(tmp_path / "export")
    directory = tmp_path / "cluster"
    state = standalone.up(directory, workers=1, cores=2)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "raftlog.audit", "run", "--input", str(root), "--master",
             state.master_url, "--out", str(tmp_path / "out"), "--partitions", "2"],
            capture_output=True, text=True, timeout=600, check=False)
    finally:
        standalone.down(directory)
    assert done.returncode == cli_run.EXIT_CLEAN, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["spark"]["master"] == state.master_url
    assert report["figures"]["message_rows_read"] == 60


@pytest.mark.slow
def test_the_job_runs_under_spark_submit(tmp_path: Path) -> None:
    export = clean_stream(last_seq=20)
    del export.copy_of("n3").records[7]
    root = export.write(tmp_path / "export")
    submit = standalone.spark_home() / "bin" / "spark-submit"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(
        [str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         str(JOB_MAIN), "--input", str(root), "--out", str(tmp_path / "out"),
         "--partitions", "2"],
        capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.returncode == cli_run.EXIT_DIVERGENT, done.stderr[-3000:]
    assert "HOLE" in done.stdout
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [(a["node"], a["action"], a["first_seq"]) for a in plan["actions"]] == [
        ("n3", "copy", 7)]
