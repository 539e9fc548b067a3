#!/usr/bin/env bash
# Pack what `scripts/gpu_check.sh` needs on a GPU machine that cannot reach a package index: the
# project's Python dependencies as wheels for that machine's Python (torch excluded: the GPU
# machine brings its CUDA build), the embedded model's config and tokenizer (random weights are
# built there, since the real ones are 94 MB as GGUF and 538 MB unpacked; `--real-model` copies
# the unpacked folder instead), and `run.sh`, which installs, prepares and runs the check.
#
#   bash scripts/gpu_bundle.sh --out .gpu --have have.txt     # have.txt: the GPU machine's
#                                                             # `python3 -m pip list --format=freeze`
#   # copy the repository with .gpu/ to the GPU machine, then there, from the repository root:
#   bash .gpu/run.sh                                          # the check and its benchmarks
#
# Options: --out DIR (default .gpu), --python-version (default 3.12), --have FILE (names already
# installed there: skipped, except the pinned ones below), --keep "names" (always packed; default
# the versions this project pins: transformers tokenizers agentscope llguidance), --no-trl (skip
# TRL, which only the GRPO-vs-TRL benchmark needs), --real-model, --all-wheels (keep the wheels
# the check never imports: by default the check's CPU dry run records what it imports and the
# large wheels it never does are left out, see gpu_bundle_size.py; a lent GPU machine takes 64
# MiB a call, the repository's files included).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=.gpu
pyver=3.12
have=""
keep="transformers tokenizers agentscope llguidance"
trl=1
real_model=0
all_wheels=0
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    --have) have=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --no-trl) trl=0; shift ;;
    --real-model) real_model=1; shift ;;
    --all-wheels) all_wheels=1; shift ;;
    *) echo "gpu_bundle: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -n "$have" && ! -f "$have" ]]; then
  echo "gpu_bundle: --have $have does not exist (write it on the GPU machine with" \
    "'python3 -m pip list --format=freeze > have.txt')" >&2
  exit 2
fi

rm -rf "$out/whl" "$out/model" && mkdir -p "$out/whl" "$out/model"
# The project's dependencies (pyproject.toml) as the installed versions pin them, torch left out.
"$python" - "$out/requirements.txt" "$trl" <<'EOF'
import sys, tomllib
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement

deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
wanted = [Requirement(d) for d in deps] + [Requirement("pytest"), Requirement("pytest-asyncio")]
if sys.argv[2] == "1":
    wanted.append(Requirement("trl"))
lines = []
for req in wanted:
    if req.name == "torch":
        continue
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    try:
        lines.append(f"{req.name}{extras}=={version(req.name)}")
    except PackageNotFoundError:
        lines.append(str(req))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF
platforms=()
for p in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
  manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${p}_x86_64")
done
echo "[gpu_bundle] downloading wheels for CPython $pyver (x86_64)"
"$python" -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d "$out/whl.all" -r "$out/requirements.txt" 2>&1 | grep -v "^WARNING: Location" || true
# Keep what the machine lacks (and the pinned ones); never torch or CUDA libraries.
"$python" - "$out" "$have" "$keep" <<'EOF'
import re, shutil, sys
from pathlib import Path

out, have_file, keep = Path(sys.argv[1]), sys.argv[2], set(sys.argv[3].split())
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = set()
if have_file:
    for line in open(have_file):
        name = re.split(r"[=<>@ ]", line.strip(), maxsplit=1)[0]
        if name:
            have.add(norm(name))
keep = {norm(k) for k in keep}
packed, size = [], 0
for wheel in sorted((out / "whl.all").glob("*.whl")):
    name = norm(wheel.name.split("-")[0])
    if name == "torch" or name.startswith(("nvidia-", "triton")):
        continue
    if name in have and name not in keep:
        continue
    shutil.copy(wheel, out / "whl" / wheel.name)
    packed.append(wheel.name)
    size += wheel.stat().st_size
shutil.rmtree(out / "whl.all")
print(f"[gpu_bundle] {len(packed)} wheels, {size / 2**20:.1f} MiB")
EOF
if ((!all_wheels)); then
  recorder=$(mktemp -d)
  "$python" scripts/gpu_bundle_size.py --recorder "$recorder"
  echo "[gpu_bundle] the check's dry run on this CPU, recording what it imports (~1 min)"
  record=(env IMPORT_LOG="$recorder/modules" PYTHONPATH="$recorder${PYTHONPATH:+:$PYTHONPATH}")
  if ! "${record[@]}" PYTHON="$python" bash scripts/gpu_check.sh --dry-run >"$recorder/dry_run.log" 2>&1; then
    echo "gpu_bundle: the check's dry run failed (log: $recorder/dry_run.log); fix it, or pack" \
      "every wheel with --all-wheels" >&2
    exit 1
  fi
  # The benchmarks only --with-benchmarks runs on the GPU: the memory sweep's and TRL's imports.
  extra="import psutil, agentscope_rft.runtime.memory, agentscope_rft.trainers.logprobs"
  if ((trl)); then extra="$extra; import datasets; from trl import GRPOConfig, GRPOTrainer"; fi
  "${record[@]}" "$python" -c "$extra"
  "$python" scripts/gpu_bundle_size.py "$out/whl" "$recorder/modules" --keep "$keep"
  rm -rf "$recorder"
fi
# The embedded model: its folder as this machine built it (config, tokenizer, template).
model_dir=$("$python" -c "from agentscope_rft.models import EMBEDDED_MODEL, resolve_model; print(resolve_model(EMBEDDED_MODEL))")
if ((real_model)); then
  cp "$model_dir"/* "$out/model/"
else
  for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    cp "$model_dir/$f" "$out/model/"
  done
fi
cat > "$out/prepare_model.py" <<'EOF'
"""Put the embedded model's folder in $AGENTSCOPE_RFT_CACHE: the packed one, with random weights
of its shape when the bundle carries only its config and tokenizer."""
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

source = Path(sys.argv[1])
target = Path(os.environ["AGENTSCOPE_RFT_CACHE"]) / "models" / "smollm2-135m-instruct"
target.mkdir(parents=True, exist_ok=True)
for file in source.iterdir():
    shutil.copy(file, target / file.name)
if not (target / "model.safetensors").exists():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    model.save_pretrained(target, safe_serialization=True)
    print("random weights of the embedded model's shape (the check measures speed, not quality)")
(target / ".agentscope-rft-complete").write_text("ok\n")
EOF
cat > "$out/run.sh" <<EOF
#!/usr/bin/env bash
# On the GPU machine, from the repository root: install the packed wheels beside the machine's
# torch, prepare the embedded model's folder, run the GPU check with its benchmarks.
set -euo pipefail
bundle=\$(dirname "\$0")
site=\${GPU_BUNDLE_SITE:-/tmp/agentscope-rft-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
  --target "\$site" "\$bundle"/whl/*.whl
export PYTHONPATH="\$site\${PYTHONPATH:+:\$PYTHONPATH}" HF_HUB_OFFLINE=1
export AGENTSCOPE_RFT_CACHE=\${AGENTSCOPE_RFT_CACHE:-/tmp/agentscope-rft-cache}
python3 "\$bundle/prepare_model.py" "\$bundle/model"
PYTHON=python3 bash scripts/gpu_check.sh --with-benchmarks
EOF
chmod +x "$out/run.sh"
echo "[gpu_bundle] wrote $out ($(du -sh "$out" | cut -f1)); on the GPU machine: bash $out/run.sh"
# What a copy of this working tree carries with the bundle: a lent GPU machine takes 64 MiB a call.
"$python" scripts/gpu_bundle_size.py --travel "$out"
