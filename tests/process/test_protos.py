"""The committed generated code under protos/raftlog/v1 (the public API) and
protos/raftlog/internal (node-to-node, Raft and on-disk records) matches its .proto files.

Regenerates with `scripts/gen-protos OUT_DIR` into a temporary directory (never the repo) and
names every committed `*_pb2*.py(i)` that differs, is missing, or has no .proto any more.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_DIR = ROOT / "protos" / "raftlog" / "v1"
PROTO_PACKAGES = ("v1", "internal", "compat")
# What protoc writes for each `<name>.proto` with the flags in scripts/gen-protos.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
gen_protos_timeout_s = 120


def regenerate(*, root: Path, out_dir: Path) -> Path:
    """Runs `root`/scripts/gen-protos into `out_dir`; returns the directory of the v1 files
    (the internal ones are beside it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = None
    if sys.prefix != sys.base_prefix:
        # Use the virtualenv running the tests, also for a copy of the scripts outside the repo.
        env = {**os.environ, "RAFTLOG_VENV": sys.prefix}
    completed = subprocess.run(
        ["bash", str(root / "scripts" / "gen-protos"), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=gen_protos_timeout_s,
    )
    assert completed.returncode == 0, f"gen-protos failed:\n{completed.stdout}{completed.stderr}"
    return out_dir / "raftlog" / "v1"


def stale_files(*, committed_dir: Path, generated_dir: Path) -> list[str]:
    """One line per committed generated file that is missing, differs, or is an orphan."""
    generated = {path.name for path in generated_dir.iterdir() if _is_generated(path.name)}
    committed = {path.name for path in committed_dir.iterdir() if _is_generated(path.name)}
    problems = [
        f"{name}: missing, run scripts/gen-protos" for name in sorted(generated - committed)
    ]
    problems += [
        f"{name}: stale, differs from what its .proto generates; run scripts/gen-protos"
        for name in sorted(generated & committed)
        if (committed_dir / name).read_bytes() != (generated_dir / name).read_bytes()
    ]
    problems += [
        f"{name}: no .proto generates it any more" for name in sorted(committed - generated)
    ]
    return problems


@pytest.mark.parametrize("package", PROTO_PACKAGES)
def test_committed_generated_code_matches_the_protos(tmp_path: Path, package: str) -> None:
    generated_dir = regenerate(root=ROOT, out_dir=tmp_path).parent / package
    committed_dir = COMMITTED_DIR.parent / package
    expected = {
        proto.stem + suffix
        for proto in committed_dir.glob("*.proto")
        for suffix in GENERATED_SUFFIXES
    }
    assert expected <= {path.name for path in generated_dir.iterdir()}
    problems = stale_files(committed_dir=committed_dir, generated_dir=generated_dir)
    assert not problems, "generated protobuf code is out of date:\n" + "\n".join(problems)


def test_a_changed_proto_is_reported_stale(tmp_path: Path) -> None:
    """A copy of the repo's scripts and protos with one .proto changed: the check must fail."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "gen-protos", copy / "scripts" / "gen-protos")
    # A stub env.sh: the copy must never (re)install anything into the virtualenv.
    (copy / "scripts" / "env.sh").write_text(
        'RAFTLOG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
    )
    shutil.copytree(ROOT / "protos", copy / "protos")
    changed = sorted((copy / "protos" / "raftlog" / "v1").glob("*.proto"))[0]
    with changed.open("a") as proto:
        proto.write("\nmessage StaleCheckOnlyInATestCopy {\n  string note = 1;\n}\n")

    generated_dir = regenerate(root=copy, out_dir=tmp_path / "out")
    problems = stale_files(committed_dir=COMMITTED_DIR, generated_dir=generated_dir)

    assert any(line.startswith(f"{changed.stem}_pb2.py: stale") for line in problems), problems
    assert any(line.startswith(f"{changed.stem}_pb2.pyi: stale") for line in problems), problems


def test_missing_and_orphan_files_are_named(tmp_path: Path) -> None:
    committed, generated = tmp_path / "committed", tmp_path / "generated"
    committed.mkdir()
    generated.mkdir()
    (generated / "a_pb2.py").write_text("new")
    (generated / "b_pb2.pyi").write_text("same")
    (committed / "b_pb2.pyi").write_text("same")
    (committed / "c_pb2_grpc.py").write_text("old")
    (committed / "c.proto").write_text("not generated code")

    assert stale_files(committed_dir=committed, generated_dir=generated) == [
        "a_pb2.py: missing, run scripts/gen-protos",
        "c_pb2_grpc.py: no .proto generates it any more",
    ]


def _is_generated(name: str) -> bool:
    return name.endswith(GENERATED_SUFFIXES)
