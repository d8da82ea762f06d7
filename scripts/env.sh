# Sourced by the scripts: makes sure .venv exists with raftlog and its dev tools installed.
# Re-installs when pyproject.toml changed since the last install.
set -euo pipefail
RAFTLOG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAFTLOG_VENV:-$RAFTLOG_ROOT/.venv}"
PY="${RAFTLOG_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp="$VENV/.raftlog-installed"
if [ ! -x "$VENV/bin/python" ]; then
    echo "raftlog: creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$RAFTLOG_ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "raftlog: installing dependencies into $VENV (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet -e "$RAFTLOG_ROOT[dev]" >&2
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
