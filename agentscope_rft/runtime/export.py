"""`agentscope-rft export`: a run's checkpoint as a standalone HF model folder, in a chosen dtype.

A checkpoint's `model/` already holds the policy in the dtype of the model the run started from
(a bf16 model's is bf16); `--dtype` writes it in another one (float32 to fine-tune it further,
float16 for a GPU without bf16).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from agentscope_rft.trainers.checkpoint import DTYPES, in_dtype, model_dtype, write_config_dtype

INDEX_FILE = "model.safetensors.index.json"


def export_model_folder(source: Path, target: Path, dtype: str = "auto") -> torch.dtype:
    """Copy the HF model folder `source` to `target` (which must not exist), its floating-point
    weights in `dtype` (`auto`: as `source` holds them); returns the dtype written. A failed
    copy leaves no half-written `target`.

    Example:
        >>> best = Path("runs/x/checkpoints/best/model")
        >>> export_model_folder(best, Path("m"), "float32")  # doctest: +SKIP
        torch.float32
    """
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use auto, {', '.join(DTYPES)}")
    held = model_dtype(source)
    wanted = held if dtype == "auto" else DTYPES[dtype]
    if wanted != held and not any(source.glob("*.safetensors")):
        raise ValueError(
            f"{source} holds no *.safetensors weights to write in {dtype} (only safetensors are "
            "converted): export it with --dtype auto"
        )
    try:
        shutil.copytree(source, target)
        if wanted != held:
            _cast_weights(target, wanted)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return wanted


def _cast_weights(folder: Path, dtype: torch.dtype) -> None:
    """Rewrite every safetensors file of `folder` (sharded or not) in `dtype`, with the index's
    total size and config.json's dtype to match."""
    from safetensors.torch import load_file, save_file

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        state = in_dtype(load_file(str(file)), dtype)
        total += sum(t.numel() * t.element_size() for t in state.values())
        save_file(state, str(file), metadata={"format": "pt"})
    index = folder / INDEX_FILE
    if index.is_file():
        settings = json.loads(index.read_text())
        settings.setdefault("metadata", {})["total_size"] = total
        index.write_text(json.dumps(settings, indent=2) + "\n")
    write_config_dtype(folder, dtype)
