"""The web-search example's configs validate, and their workflows load."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentscope_rft.api import load_workflow
from agentscope_rft.config import load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "web_search"


def test_cpu_config_validates_and_its_app_loads() -> None:
    config = load_config(EXAMPLE / "config.yaml")
    assert config.engine.type == "embedded" and config.trainer.type == "torch"
    assert config.explorer.seed is not None  # the embedded engine takes seeded requests
    assert config.model.chat_template is not None
    assert Path(config.model.chat_template).is_file()
    assert Path(config.tasks.train or "").is_file() and Path(config.tasks.eval or "").is_file()
    assert load_workflow(config.workflow or "").name == "search_agent"


def test_gpu_recipe_validates_with_search_r1_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(EXAMPLE / "config_gpu.yaml")
    assert config.engine.type == "vllm" and config.trainer.type == "verl"
    assert 5 <= config.explorer.group_size <= 8
    assert config.trainer.lr == pytest.approx(1e-6)
    assert config.explorer.sampling.max_tokens == 500
    # The corpus comes from $SEARCH_CORPUS; a missing file is reported when the app loads.
    monkeypatch.setenv("SEARCH_CORPUS", "/nonexistent/wiki-18.jsonl")
    with pytest.raises(Exception, match=r"wiki-18.jsonl does not exist"):
        load_workflow(config.workflow or "")
    monkeypatch.delenv("SEARCH_CORPUS")
    with pytest.raises(Exception, match=r"set SEARCH_CORPUS to a wiki-18"):
        load_workflow(config.workflow or "")
    # The tasks are Search-R1's parquet files, not the generated ones: preflight names them.
    assert config.tasks.train is not None and config.tasks.train.endswith(".parquet")
    assert not Path(config.tasks.train).exists()
