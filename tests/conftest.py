"""Shared test set-up: markers that skip with a visible reason, and the tiny test model."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none on this machine")
    has_cuda = _cuda_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama with the embedded model's tokenizer and tool-capable template."""
    from agentscope_rft.models import TINY_MODEL, resolve_model

    cached = resolve_model(TINY_MODEL)
    target = tmp_path_factory.mktemp("models") / "tiny-random"
    shutil.copytree(cached, target)
    return str(target)
