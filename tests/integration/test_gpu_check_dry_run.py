"""`scripts/gpu_check.sh --dry-run` runs on CPU: the gpu tests collect (and skip), and the same
end-to-end training path as the CUDA check finishes and reports its measures, and the engine's
profile records its thread's ops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_passes_on_cpu() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in ("tokens/s (trained):", "step time:", "peak GPU memory:", "MFU:"):
        assert line in done.stdout
    assert "loss finite: True" in done.stdout
    # the engine's profile: its own thread's ops recorded, beside HF generate on the same prompts
    ops = re.search(r"decode steps (\d+), [\d.]+ ms each .* per step: (\d+) aten ops", done.stdout)
    assert ops is not None and int(ops[1]) > 0 and int(ops[2]) > 0, done.stdout[-3000:]
    assert "| HF generate, one padded batch |" in done.stdout
    # and beside a busy Python thread, at the default switch interval and at 0.5 ms
    beside = re.findall(r"switch interval ([\d.]+) ms: ([\d.]+) ms a decode step", done.stdout)
    assert [float(ms) for ms, _ in beside] == [5.0, 0.5], done.stdout[-3000:]
    assert all(float(step) > 0 for _, step in beside), beside


def test_gpu_check_refuses_unknown_arguments() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--fast"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "usage" in done.stderr
