"""The repo is ruff-clean and mypy-strict-clean, as `scripts/typecheck` checks it, and
docs/limits.md documents every limit in base/limits.py with its current value.

Fails with the tools' own output. Two more tests run the script on a tiny copy of the layout
with one bad module, to show the checks can fail and that generated code is skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raftlog.base import limits

ROOT = Path(__file__).resolve().parents[2]
# A cold mypy run over the repo with the protobuf and grpc stubs takes ~20 s on 2 cores.
typecheck_timeout_s = 300

BAD_MODULE = '''"""A module with one type error and one unused import."""

import os


def half(count: int) -> int:
    return count / 2
'''


def run_typecheck(*, root: Path, only: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "typecheck"), "--only", only],
        capture_output=True,
        text=True,
        timeout=typecheck_timeout_s,
    )


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_repo_is_clean(tool: str) -> None:
    completed = run_typecheck(root=ROOT, only=tool)
    assert completed.returncode == 0, (
        f"scripts/typecheck --only {tool} found errors:\n{completed.stdout}{completed.stderr}"
    )


@pytest.fixture
def layout_copy(tmp_path: Path) -> Path:
    """scripts/typecheck, pyproject.toml and the protos in a fresh tree; node/ holds BAD_MODULE.

    env.sh is replaced by a stub that only puts this interpreter's bin/ on PATH, so the copy can
    never (re)install anything into the virtualenv.
    """
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "typecheck", copy / "scripts" / "typecheck")
    (copy / "scripts" / "env.sh").write_text(
        'RAFTLOG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
    )
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(ROOT / "protos", copy / "protos")
    for part in ("base", "node", "raft", "chaos"):
        (copy / part).mkdir()
        (copy / part / "__init__.py").write_text("")
    (copy / "node" / "bad.py").write_text(BAD_MODULE)
    # Importing generated gRPC code must not drag its untyped functions into the check.
    (copy / "node" / "uses_grpc.py").write_text(
        '"""Imports generated gRPC code."""\n\n'
        "from raftlog.v1 import streams_pb2, streams_pb2_grpc\n\n"
        "__all__ = ['streams_pb2', 'streams_pb2_grpc']\n"
    )
    return copy


def test_mypy_reports_a_type_error_and_skips_generated_code(layout_copy: Path) -> None:
    completed = run_typecheck(root=layout_copy, only="mypy")
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    assert "raftlog/node/bad.py:7: error" in output, output
    assert "_pb2" not in output, output


def test_ruff_reports_an_unused_import_and_skips_generated_code(layout_copy: Path) -> None:
    completed = run_typecheck(root=layout_copy, only="ruff")
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    assert "F401" in output, output
    assert "node/bad.py" in output, output
    assert "_pb2" not in output, output


def test_every_limit_is_documented_with_its_value() -> None:
    """Each constant in base/limits.py has a row `| `name` | value ... |` in docs/limits.md."""
    documented: dict[str, str] = {}
    for line in (ROOT / "docs" / "limits.md").read_text().splitlines():
        row = re.match(r"\|\s*`(\w+)`\s*\|\s*([0-9][0-9,]*(?:\.[0-9]+)?)", line)
        if row:
            documented[row.group(1)] = row.group(2).replace(",", "")
    problems = []
    for name, value in sorted(vars(limits).items()):
        if name.startswith("_") or not isinstance(value, int | float):
            continue
        if name not in documented:
            problems.append(f"{name} = {value}: no row in docs/limits.md")
        elif float(documented[name]) != value:
            problems.append(f"{name} = {value}: docs/limits.md says {documented[name]}")
    assert not problems, "\n".join(problems)
