# Sourced by the scripts, and by users (`source scripts/env.sh`): makes sure .venv exists with
# raftlog and its dev tools installed, and puts .venv/bin on PATH. Re-installs when
# pyproject.toml changed since the last install.
#
# It leaves the caller's shell options alone: no `set -e`/`-u`/`pipefail` here (a user's
# interactive shell would exit on its next failing command); the scripts set strict mode
# themselves before sourcing this. So each step checks its own status and `return`s on failure.
RAFTLOG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
VENV="${RAFTLOG_VENV:-$RAFTLOG_ROOT/.venv}"
_raftlog_py="${RAFTLOG_PYTHON:-python3.11}"
command -v "$_raftlog_py" >/dev/null 2>&1 || _raftlog_py=python3
_raftlog_stamp="$VENV/.raftlog-installed"
if [ ! -x "$VENV/bin/python" ]; then
    echo "raftlog: creating $VENV" >&2
    "$_raftlog_py" -m venv "$VENV" || { unset _raftlog_py _raftlog_stamp; return 1; }
fi
if [ ! -f "$_raftlog_stamp" ] || [ "$RAFTLOG_ROOT/pyproject.toml" -nt "$_raftlog_stamp" ]; then
    echo "raftlog: installing dependencies into $VENV (first run takes a few minutes)" >&2
    if ! { "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2 &&
           "$VENV/bin/python" -m pip install --quiet -e "$RAFTLOG_ROOT[dev]" >&2 &&
           touch "$_raftlog_stamp"; }; then
        echo "raftlog: installing into $VENV failed" >&2
        unset _raftlog_py _raftlog_stamp
        return 1
    fi
fi
unset _raftlog_py _raftlog_stamp
export PATH="$VENV/bin:$PATH"
