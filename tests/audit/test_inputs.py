"""Bad input is refused before any Spark work, with the reason (exit 2), or labelled."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raftlog.audit import cli_run, schema
from raftlog.audit.inputs import BadInput, check_exports
from tests.audit.frames import Export, View, clean_stream


def _export(tmp_path: Path) -> Path:
    return clean_stream(last_seq=3).write(tmp_path / "export")


def _manifest(root: Path, node: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((root / node / schema.MANIFEST).read_text())
    return loaded


def _set_manifest(root: Path, node: str, **changes: object) -> None:
    manifest = _manifest(root, node) | changes
    (root / node / schema.MANIFEST).write_text(json.dumps(manifest))


def _no_manifest(root: Path) -> None:
    (root / "n2" / schema.MANIFEST).unlink()


def _no_table(root: Path) -> None:
    (root / "n3" / schema.STREAMS_FILE).unlink()


def _mixed_versions(root: Path) -> None:
    _set_manifest(root, "n2", schema_version=schema.SCHEMA_VERSION + 1)


def _twice(root: Path) -> None:
    shutil.copytree(root / "n1", root / "n1-again")


def _two_clusters(root: Path) -> None:
    _set_manifest(root, "n3", cluster="d" * 64)


def _short_file(root: Path) -> None:
    _set_manifest(root, "n1", rows={**_manifest(root, "n1")["rows"],  # type: ignore[dict-item]
                                    schema.MESSAGES_FILE: 99})


def _wrong_type(root: Path) -> None:
    table = pq.read_table(root / "n1" / schema.META_FILE)
    index = table.schema.get_field_index("applied_index")
    table = table.set_column(index, "applied_index", table["applied_index"].cast(pa.string()))
    pq.write_table(table, root / "n1" / schema.META_FILE)


def _other_node_rows(root: Path) -> None:
    shutil.copy(root / "n1" / schema.MESSAGES_FILE, root / "n2" / schema.MESSAGES_FILE)


def _empty(root: Path) -> None:
    for child in root.iterdir():
        shutil.rmtree(child)


def _no_streams(root: Path) -> None:
    shutil.rmtree(root)
    Export(copies=[], views={"n1": [], "n2": []}).write(root)


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "node dir without a manifest": (_no_manifest, "partial export: .*n2 has no manifest"),
    "a missing table file": (_no_table, "partial export: .*n3 lacks streams.parquet"),
    "mixed schema versions": (_mixed_versions, "mixed or unknown schema versions"),
    "a node exported twice": (_twice, "node n1 exported twice"),
    "exports of two clusters": (_two_clusters, "exports from different clusters"),
    "a truncated table": (_short_file, "holds 3 rows, the manifest says 99"),
    "a column of another type": (_wrong_type, "column applied_index is string"),
    "rows of another node": (_other_node_rows, "holds rows of node 'n1'"),
    "an empty export directory": (_empty, "empty export"),
    "a cluster with no streams": (_no_streams, "nothing to audit"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_with_its_reason(tmp_path: Path, case: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = _export(tmp_path)
    damage, reason = BAD[case]
    damage(root)
    with pytest.raises(BadInput, match=reason):
        check_exports(root)
    args = Namespace(input=root, master=None, out=tmp_path / "out", plan=None, partitions=2,
                     quiet=True)
    assert cli_run.run(args) == cli_run.EXIT_BAD_INPUT  # before any Spark session
    assert "bad input" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_member_without_an_export_is_labelled_not_exported(tmp_path: Path) -> None:
    export = clean_stream(last_seq=3, view=View("s", replicas=("n1", "n2", "n4")))
    root = export.write(tmp_path / "export")
    _set_manifest(root, "n1", members=["n1", "n2", "n3", "n4"])
    exports = check_exports(root)
    assert exports.node_ids == ("n1", "n2", "n3")
    assert exports.not_exported == ("n4",)


def test_the_command_line_refuses_a_missing_directory(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "raftlog.audit", "run", "--input",
                           str(tmp_path / "nowhere")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == cli_run.EXIT_BAD_INPUT
    assert "no such export directory" in done.stderr
