"""Build the configured engine."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.config import EngineConfig, ModelConfig
from agentscope_rft.engines.base import Engine
from agentscope_rft.engines.embedded import EmbeddedEngine


def read_chat_template(value: str | None) -> str | None:
    """A template given inline, or as the path of a .jinja file."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if "{" not in value and path.is_file():
        return path.read_text()
    if "{" not in value:
        raise ValueError(f"model.chat_template: {value!r} is neither a template nor a file")
    return value


def build_engine(model: ModelConfig, engine: EngineConfig) -> Engine:
    """Create (not start) the engine for `model`.

    Example:
        >>> engine = build_engine(ModelConfig(), EmbeddedEngineConfig())  # doctest: +SKIP
    """
    return EmbeddedEngine(
        model.name_or_path,
        dtype=engine.dtype,
        device=engine.device,
        max_batch_size=engine.max_batch_size,
        max_prefill_tokens=engine.max_prefill_tokens,
        max_model_len=model.max_model_len,
        chat_template=read_chat_template(model.chat_template),
        reuse_prompt_tokens=engine.reuse_prompt_tokens,
        seed=engine.seed,
    )
