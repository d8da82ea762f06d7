"""scripts/bench_profile.py: which phases are profiled, the py-spy command lines, and a real
py-spy run against a busy Python process (skipped, saying why, where py-spy cannot attach)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import bench_scripts

BUSY = "import time\nwhile True:\n    sum(range(10_000))\n    time.sleep(0.0005)\n"


@pytest.fixture(scope="module")
def bp() -> ModuleType:
    return bench_scripts.load("bench_profile")


def test_a_phase_is_profiled_when_its_name_contains_the_wanted_text(bp: ModuleType) -> None:
    profiler = bp.PhaseProfiler(phase="Fetch+Ack, batch 100", out_dir=Path("/x"))
    assert profiler.matches("fetch+ack, batch 100")
    assert profiler.matches("fetch+ack, batch 1000")  # contains it: both are profiled
    assert not profiler.matches("batch 100")
    with pytest.raises(ValueError, match="profile-mode"):
        bp.PhaseProfiler(phase="x", out_dir=Path("/x"), mode="wall")


def test_one_command_per_node_and_format_with_the_mode_flag(bp: ModuleType) -> None:
    profiler = bp.PhaseProfiler(phase="batch", out_dir=Path("/out"), mode="gil",
                                output_format="both", executable="py-spy")
    made = profiler.commands("batch 100", {"n2": 20, "n1": 10})
    assert [path.name for _, path in made] == ["batch-100-n1.svg", "batch-100-n1.txt",
                                               "batch-100-n2.svg", "batch-100-n2.txt"]
    command, _ = made[0]
    assert command[:4] == ["py-spy", "record", "--pid", "10"]
    assert "--gil" in command and "--nonblocking" in command and "--idle" not in command
    assert command[command.index("--format") + 1] == "flamegraph"
    idle = bp.PhaseProfiler(phase="b", out_dir=Path("/o"), mode="idle", executable="py-spy")
    assert "--idle" in idle.commands("b", {"n": 1})[0][0]


def test_a_profiled_phase_writes_a_flame_graph_of_the_process(bp: ModuleType,
                                                               tmp_path: Path) -> None:
    try:
        executable = bp.py_spy()
    except SystemExit as missing:
        pytest.skip(str(missing))
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        profiler = bp.PhaseProfiler(phase="busy", out_dir=tmp_path, executable=executable,
                                    rate_hz=97)

        async def phase() -> None:
            async with profiler.around("busy phase", {"n1": busy.pid}):
                await asyncio.sleep(1.5)

        asyncio.run(phase())
    finally:
        busy.kill()
        busy.wait(timeout=10)
    if not profiler.written:
        pytest.skip("py-spy could not attach here (ptrace denied?): no profile written")
    [svg] = profiler.written
    assert svg.name == "busy-phase-n1.svg"
    assert "<svg" in svg.read_text()[:2000]
