"""`scripts/bench --profile PHASE`: a py-spy flame graph of every node for one benchmark phase.

While each phase whose name contains PHASE (case-insensitive: "fetch+ack, batch 100", "batch",
"unary, 1 caller", ...) runs, one `py-spy record` per node process samples it and, when the
phase ends, writes `<dir>/<phase>-<node>.svg` (and a `.txt` of collapsed stacks beside it with
--profile-format both, which diffs well between runs). Sampling is non-blocking (the node is not
paused per sample), so what the profile costs the figures is small but not zero: compare the
figures of a profiled run with an unprofiled one before trusting them.

Modes (`--profile-mode`): `cpu` (default) shows where the nodes' threads run Python or native
code; `gil` only the thread holding the GIL at each sample, which is what a GIL convoy looks
like; `idle` adds waiting threads too, which shows where a call waits (timers, locks, the
poller).

py-spy needs ptrace rights on the nodes (root, or kernel.yama.ptrace_scope 0). It is a dev
dependency; without it --profile stops the run before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

profile_rate_hz = 199  # samples a second per node (a prime: it does not beat with 10 ms timers)
profile_stop_timeout_s = 30.0  # py-spy writes its file within this once interrupted
profile_attach_s = 0.3  # time given to py-spy to attach before the phase starts
MODES = ("cpu", "gil", "idle")
FORMATS = ("flamegraph", "raw", "both")


def py_spy() -> str:
    """The py-spy executable: beside this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile needs py-spy: `pip install py-spy` (a dev dependency; "
                         "scripts/env.sh installs it)")
    return found


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


@dataclass
class PhaseProfiler:
    """Profiles the phases whose name contains `phase`; `written` lists the files made."""

    phase: str
    out_dir: Path
    mode: str = "cpu"
    output_format: str = "flamegraph"
    rate_hz: int = profile_rate_hz
    executable: str = ""
    written: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--profile-mode: one of {', '.join(MODES)}")
        if self.output_format not in FORMATS:
            raise ValueError(f"--profile-format: one of {', '.join(FORMATS)}")

    def matches(self, phase_name: str) -> bool:
        return self.phase.lower() in phase_name.lower()

    def commands(self, phase_name: str, pids: Mapping[str, int]
                 ) -> list[tuple[list[str], Path]]:
        """The py-spy command lines for one phase and the file each writes."""
        formats = ("flamegraph", "raw") if self.output_format == "both" else (self.output_format,)
        made: list[tuple[list[str], Path]] = []
        for node, pid in sorted(pids.items()):
            for kind in formats:
                suffix = ".svg" if kind == "flamegraph" else ".txt"
                path = self.out_dir / f"{slug(phase_name)}-{slug(node)}{suffix}"
                command = [self.executable or py_spy(), "record", "--pid", str(pid),
                           "--rate", str(self.rate_hz), "--format", kind,
                           "--output", str(path), "--nonblocking", "--threads"]
                if self.mode == "gil":
                    command.append("--gil")
                elif self.mode == "idle":
                    command.append("--idle")
                made.append((command, path))
        return made

    @contextlib.asynccontextmanager
    async def around(self, phase_name: str, pids: Mapping[str, int]) -> AsyncIterator[None]:
        """Samples every node in `pids` while the block runs, if this phase is wanted."""
        if not self.matches(phase_name):
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        started = [(subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True), path)
                   for command, path in self.commands(phase_name, pids)]
        await asyncio.sleep(profile_attach_s)
        try:
            yield
        finally:
            await asyncio.to_thread(self._stop, started)

    def _stop(self, started: list[tuple[subprocess.Popen[str], Path]]) -> None:
        for proc, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, path in started:
            try:
                _, errors = proc.communicate(timeout=profile_stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, errors = proc.communicate()
            if path.exists() and path.stat().st_size > 0:
                self.written.append(path)
            else:
                print(f"[bench] py-spy wrote no {path.name}: {errors.strip()[-500:]}",
                      file=sys.stderr, flush=True)
