#!/usr/bin/env bash
# The test command of the README: sets up .venv if needed, then runs the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/agentscope-rft ] || [ "${AGENTSCOPE_RFT_SETUP:-0}" = "1" ]; then
    bash scripts/setup.sh || exit 1
fi

export PYTHONHASHSEED=0
export TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] ERROR: pytest collected no tests; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
