#!/usr/bin/env bash
# The GPU check: the `gpu`-marked tests, then a short end-to-end training on CUDA (embedded engine
# + torch trainer, a Qwen2.5-0.5B-shaped random model with the project's tokenizer), printing
# tokens/s, step time, peak GPU memory and MFU. Sized for one short run on one H100 (< 8 min:
# the tests ~2-3 min, the training ~2-3 min, each under its own timeout).
#
#   bash scripts/gpu_check.sh            # on a CUDA machine
#   bash scripts/gpu_check.sh --dry-run  # on CPU: everything but CUDA (the tests collect and skip,
#                                        # the same training path on a tiny model, ~1 min)
#
# PYTHON picks the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

dry_run=0
case "${1:-}" in
  --dry-run) dry_run=1 ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

started=$SECONDS
if (( dry_run )); then
  echo "== gpu_check --dry-run: CPU, no CUDA =="
  "$python" -m pytest tests/gpu -m gpu -q -p no:cacheprovider
  "$python" benchmarks/gpu_check.py --device cpu --shape tiny --steps 2 --tokens 16
else
  if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; on CPU run: bash scripts/gpu_check.sh --dry-run" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  echo "== gpu-marked tests =="
  timeout 240 "$python" -m pytest tests/gpu -m gpu -q -p no:cacheprovider
  echo "== end-to-end training on CUDA =="
  timeout 300 "$python" benchmarks/gpu_check.py --device cuda --shape qwen2.5-0.5b --steps 4
fi
echo "gpu_check: done in $(( SECONDS - started )) s"
