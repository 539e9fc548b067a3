"""`agentscope-rft doctor`: what is usable on this machine."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package(name: str, package: str, purpose: str) -> Check:
    version = _version(package)
    if version is None:
        return Check(name, False, f"{package} not installed ({purpose})")
    return Check(name, True, f"{package} {version}")


def _allocator() -> Check:
    """Which allocator libraries `run.allocator: jemalloc` / `tcmalloc` (or `auto`) find."""
    from agentscope_rft.runtime.memory import jemalloc_library, tcmalloc_library

    if not sys.platform.startswith("linux"):
        return Check("allocator", True, "the system's (run.allocator applies on Linux)")
    jemalloc, tcmalloc = jemalloc_library(), tcmalloc_library()
    if jemalloc is None and tcmalloc is None:
        return Check(
            "allocator",
            False,
            "no jemalloc or tcmalloc (run.allocator: tcmalloc or jemalloc, the low-memory "
            "recipe with a memory budget); apt install libtcmalloc-minimal4, pip install "
            "'ray[default]' (bundles jemalloc) or apt install libjemalloc2",
        )
    found = (("jemalloc", jemalloc), ("tcmalloc", tcmalloc))
    names = [f"{name} ({path}) for run.allocator: {name}" for name, path in found if path]
    return Check("allocator", True, "; ".join(names))


def _torch() -> Check:
    import torch

    device = "CUDA: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
    return Check("torch", True, f"torch {torch.__version__}, {device}")


def _embedded_model() -> Check:
    from agentscope_rft.models import (
        EMBEDDED_MODEL,
        ModelNotFoundError,
        cache_root,
        embedded_gguf_path,
    )

    try:
        gguf = embedded_gguf_path()
    except ModelNotFoundError as exc:
        return Check("embedded model", False, str(exc))
    cached = (cache_root() / "models" / EMBEDDED_MODEL).is_dir()
    state = "converted (cached)" if cached else "converted on first use (~20 s)"
    return Check("embedded model", True, f"{EMBEDDED_MODEL} from {gguf.name}, {state}")


def _vllm() -> Check:
    from agentscope_rft.engines.vllm_env import VLLMNotFoundError, check_vllm, find_vllm_python

    try:
        python = find_vllm_python(None)
    except VLLMNotFoundError:
        return Check("engine: vllm", False, "no vLLM environment (agentscope-rft install-vllm)")
    ok, detail = check_vllm(python)
    return Check("engine: vllm", ok, f"{detail} ({python})" if ok else detail)


def run_checks() -> list[Check]:
    """All checks, in display order."""
    checks = [
        Check("python", True, platform.python_version()),
        _torch(),
        _package("transformers", "transformers", "models"),
        _package("agentscope", "agentscope", "agent apps"),
        _embedded_model(),
        _allocator(),
        Check("engine: embedded", True, "transformers, in-process"),
        _vllm(),
        Check("trainer: torch", True, "plain PyTorch (+ peft for LoRA)"),
        _package("trainer: verl", "verl", "multi-GPU trainer; pip install 'agentscope-rft[verl]'"),
        _package("runtime: ray", "ray", "multi-node runtime; pip install 'agentscope-rft[ray]'"),
        _package("env: search", "bm25s", "search environment; pip install 'agentscope-rft[envs]'"),
        _package("env: alfworld", "alfworld", "ALFWorld environment"),
        _package("env: frozenlake", "gymnasium", "FrozenLake environment"),
        _package("monitor: wandb", "wandb", "W&B logging"),
        _package("monitor: mlflow", "mlflow", "MLflow logging"),
    ]
    return checks
