"""scripts/env.sh, sourced the way a user does it from an interactive shell: it leaves the shell's
options as they were (a failing command afterwards does not end the shell), still works for the
scripts that source it in strict mode, and reports its own failures without ending the shell.

Every run points RAFTLOG_VENV at a stand-in virtualenv whose install stamp is newer than
pyproject.toml, so nothing is created or installed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_SH = ROOT / "scripts" / "env.sh"
run_timeout_s = 30.0
OPTIONS = 'set +o; shopt -p; echo "errtrace=$-"'  # every shell option, in a comparable form


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A stand-in .venv with an up-to-date stamp. Its bin/python only fails, so that even a
    (re)install that env.sh should not start could not touch any real interpreter."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'stand-in python: not for installing' >&2\nexit 97\n")
    python.chmod(0o755)
    stamp = venv / ".raftlog-installed"
    stamp.touch()
    later_s = (ENV_SH.parents[1] / "pyproject.toml").stat().st_mtime + 10 * 365 * 86400
    os.utime(stamp, (later_s, later_s))
    return venv


def bash(script: str, *, venv: Path, quiet: bool = True, **env: str
         ) -> subprocess.CompletedProcess[str]:
    """Runs `script`; `quiet`: asserts that env.sh neither created nor installed anything."""
    environ = {**os.environ, "RAFTLOG_VENV": str(venv), "ENV_SH": str(ENV_SH), **env}
    completed = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                               env=environ, timeout=run_timeout_s)
    if quiet:
        assert "installing" not in completed.stderr and "creating" not in completed.stderr, (
            completed.stderr)
    return completed


def test_a_failing_command_after_sourcing_does_not_end_the_shell(venv: Path) -> None:
    completed = bash('source "$ENV_SH"; false; echo still-here', venv=venv)
    assert completed.stdout.splitlines() == ["still-here"], completed
    assert completed.returncode == 0, completed


@pytest.mark.parametrize("preset", ["", "set -u", "set -euo pipefail", "set -o posix"])
def test_sourcing_leaves_every_shell_option_as_it_was(venv: Path, preset: str) -> None:
    completed = bash(f'{preset}\nbefore="$({OPTIONS})"\nsource "$ENV_SH"\n'
                     f'after="$({OPTIONS})"\n[ "$before" = "$after" ] && echo same', venv=venv)
    assert completed.stdout.splitlines() == ["same"], completed


def test_it_puts_the_virtualenv_first_on_path(venv: Path) -> None:
    completed = bash('set -euo pipefail; source "$ENV_SH"; command -v python; '
                     'echo "$RAFTLOG_ROOT"', venv=venv)
    assert completed.stdout.splitlines() == [str(venv / "bin" / "python"), str(ROOT)], completed


def test_a_failure_inside_is_reported_and_returns_without_ending_the_shell(venv: Path) -> None:
    """An interactive shell gets a non-zero status back; a strict-mode script stops there."""
    missing = venv.parent / "missing-venv"
    interactive = bash('source "$ENV_SH"; echo "status=$?"; echo still-here',
                       venv=missing, quiet=False, RAFTLOG_PYTHON="false")
    assert interactive.stdout.splitlines() == ["status=1", "still-here"], interactive
    strict = bash('set -euo pipefail; source "$ENV_SH"; echo not-reached',
                  venv=missing, quiet=False, RAFTLOG_PYTHON="false")
    assert strict.returncode != 0 and "not-reached" not in strict.stdout, strict


def test_every_script_that_sources_it_sets_strict_mode_itself_first() -> None:
    scripts = [path for path in sorted((ROOT / "scripts").iterdir())
               if path.is_file() and "env.sh" in path.read_text(errors="replace")
               and path.name != "env.sh"]
    assert scripts, "no script sources env.sh"
    for path in scripts:
        text = path.read_text()
        strict = re.search(r"^set -euo pipefail$", text, re.MULTILINE)
        source = re.search(r"^source .*env\.sh", text, re.MULTILINE)
        if source is None:
            continue
        assert strict is not None and strict.start() < source.start(), path.name
