#!/usr/bin/env bash
# The GPU check: the `gpu`-marked tests, then a short end-to-end training on CUDA (embedded engine
# + torch trainer, a Qwen2.5-0.5B-shaped random model with the project's tokenizer), printing
# tokens/s, step time, peak GPU memory and MFU. Sized for one short run on one H100 (< 8 min:
# the tests ~2-3 min, the training ~2-3 min, each under its own timeout).
#
#   bash scripts/gpu_check.sh            # on a CUDA machine
#   bash scripts/gpu_check.sh --with-benchmarks  # + train-step GPU memory at 1k-8k tokens, a
#                                        # profile of the engine's exploring (vs HF generate) and
#                                        # the GRPO step vs TRL's GRPOTrainer in bf16 (~5 min more)
#   bash scripts/gpu_check.sh --dry-run  # on CPU: everything but CUDA (the tests collect and skip,
#                                        # the same training path on a tiny model, ~1 min)
#
# PYTHON picks the interpreter (default .venv/bin/python). On a GPU machine without a package
# index, `bash scripts/gpu_bundle.sh` packs what it needs (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

dry_run=0
benchmarks=0
case "${1:-}" in
  --dry-run) dry_run=1 ;;
  --with-benchmarks) benchmarks=1 ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--dry-run | --with-benchmarks]" >&2; exit 2 ;;
esac

started=$SECONDS
failed=()
if (( dry_run )); then
  echo "== gpu_check --dry-run: CPU, no CUDA =="
  "$python" -m pytest tests/gpu -m gpu -q -p no:cacheprovider
  "$python" benchmarks/gpu_check.py --device cpu --shape tiny --steps 2 --tokens 16
  "$python" benchmarks/engine_profile.py --device cpu --shape tiny --prompts 8 --tokens 8 --top 5
else
  if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; on CPU run: bash scripts/gpu_check.sh --dry-run" >&2
    exit 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  # Each part runs whatever the one before did, so one short lease reports them all.
  echo "== gpu-marked tests =="
  timeout 240 "$python" -m pytest tests/gpu -m gpu -q -p no:cacheprovider || failed+=("gpu tests (rc $?)")
  echo "== end-to-end training on CUDA =="
  timeout 300 "$python" benchmarks/gpu_check.py --device cuda --shape qwen2.5-0.5b --steps 4 \
    || failed+=("end-to-end training (rc $?)")
  if (( benchmarks )); then
    echo "== train-step GPU memory against sequence length =="
    # One child process per length (~20-40 s each); GPU_CHECK_SEQ_LENGTHS narrows it.
    timeout 300 "$python" benchmarks/memory.py --parts seq --device cuda \
      --seq-lengths "${GPU_CHECK_SEQ_LENGTHS:-1024,2048,4096,8192}" --seq-attention gqa \
      || failed+=("memory sweep (rc $?)")
    echo "== where the embedded engine's exploring time goes (vs HF generate, one batch) =="
    timeout 180 "$python" benchmarks/engine_profile.py --device cuda --prompts 32 --tokens 32 \
      || failed+=("engine profile (rc $?)")
    echo "== GRPO step vs TRL GRPOTrainer, bf16 both =="
    if "$python" -c "import trl" 2>/dev/null; then
      timeout 240 "$python" benchmarks/trainer.py --device cuda --trl-bf16 --steps 3 \
        || failed+=("TRL comparison (rc $?)")
    else
      echo "trl is not installed: skipped (pip install trl)"
    fi
  fi
fi
echo "gpu_check: done in $(( SECONDS - started )) s"
if (( ${#failed[@]} )); then
  printf 'gpu_check: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
