"""`raftlog audit run` end to end on exports written to disk (the shared session): exit
status, progress, the summary table, the JSON report, the HTML page and the plan file."""

from __future__ import annotations

import io
import json
from argparse import Namespace
from pathlib import Path

from pyspark.sql import SparkSession

from raftlog.audit import cli_run
from tests.audit.frames import NODES, Export, digest, records
from tests.audit.scenarios import add_clean


def _run(spark: SparkSession, root: Path, out: Path) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    args = Namespace(input=root, master=None, out=out, plan=out / "repair.json", partitions=2,
                     quiet=False)
    status = cli_run.run(args, spark=spark, stdout=stdout, stderr=stderr)
    return status, stdout.getvalue(), stderr.getvalue()


def _export(*, divergent: bool) -> Export:
    export = Export(copies=[], views={node: [] for node in NODES})
    for stream in ("orders", "payments"):
        copies = add_clean(export, stream)
        if divergent and stream == "orders":
            for seq in (3, 4):
                del copies["n2"].records[seq]
            copies["n3"].records[8] = (1, digest(stream, 8, "flipped"))
    return export


def test_a_clean_export_exits_0_with_every_output(spark: SparkSession, tmp_path: Path) -> None:
    root = _export(divergent=False).write(tmp_path / "export")
    status, stdout, stderr = _run(spark, root, tmp_path / "out")
    assert status == cli_run.EXIT_CLEAN
    assert "clean: every replica agrees" in stdout and "orders" in stdout
    assert "comparing 60 message rows of 3 nodes" in stderr
    assert "read 60 message rows; 0 blocks of" in stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["clean"] is True and report["divergences"] == []
    assert report["figures"]["message_rows_read"] == 60
    assert report["spark"]["master"].startswith("local")
    assert [s["seqs"] for s in report["streams"]] == [10, 10]
    plan = json.loads((tmp_path / "out" / "repair.json").read_text())
    assert plan["actions"] == [] and plan["unplanned"] == []
    assert "Clean: every replica agrees" in (tmp_path / "out" / "report.html").read_text()


def test_a_divergent_export_exits_1_with_the_records_side_by_side(
        spark: SparkSession, tmp_path: Path) -> None:
    root = _export(divergent=True).write(tmp_path / "export")
    status, stdout, _ = _run(spark, root, tmp_path / "out")
    assert status == cli_run.EXIT_DIVERGENT
    table = stdout.splitlines()
    assert table[0].split() == ["stream", "replicas", "primary", "seqs", "HOLE", "CONTENT"]
    assert table[1].split() == ["orders", "n1,n2,n3", "n1", "1..10", "(10)", "1", "1"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    content = next(d for d in report["divergences"] if d["class"] == "CONTENT")
    assert content["evidence"]["digest"] == digest("orders", 8, "flipped")
    assert content["evidence"]["authority_digest"] == records("orders", [8])[8][1]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in page and "First differing records" in page
    assert digest("orders", 8, "flipped") in page
    plan = json.loads((tmp_path / "out" / "repair.json").read_text())
    assert [(a["node"], a["action"], a.get("first_seq"), a.get("last_seq"))
            for a in plan["actions"]] == [("n2", "copy", 3, 4), ("n3", "copy", 8, 8)]
