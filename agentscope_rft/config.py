"""Run configuration: one pydantic model per component, loaded from short YAML.

Defaults live only here. Unknown keys are errors with a did-you-mean suggestion.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """Base for config sections: unknown keys are errors that suggest the closest known key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _did_you_mean(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            aliases = {f.alias for f in cls.model_fields.values() if f.alias}
            for key in data:
                if key not in known and key not in aliases:
                    close = difflib.get_close_matches(str(key), sorted(known), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    raise ValueError(
                        f"unknown key {key!r}{hint} (known keys: {', '.join(sorted(known))})"
                    )
        return data


class ModelConfig(Section):
    """The policy model."""

    name_or_path: str = "smollm2-135m-instruct"
    """`smollm2-135m-instruct` (embedded default), `tiny-random` (tests), or a local HF folder."""
    chat_template: str | None = None
    """A Jinja chat template (text or a path to a .jinja file) replacing the tokenizer's."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context window in tokens; default: the model's `max_position_embeddings`."""


class EmbeddedEngineConfig(Section):
    """The embedded transformers engine (CPU or one CUDA device, in-process)."""

    type: Literal["embedded"] = "embedded"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """`auto`: bf16 on CUDA; on CPU bf16 only where it measures faster than fp32."""
    device: str = "auto"
    """`auto` (CUDA if available), `cpu`, `cuda` or `cuda:N`."""
    max_batch_size: int = Field(default=32, ge=1, le=1024)
    """Sequences decoded together in one batch."""
    max_prefill_tokens: int = Field(default=8192, ge=64)
    """Padded prompt tokens admitted per prefill step (bounds latency of running requests)."""
    reuse_prompt_tokens: bool = True
    """Reuse the exact sampled tokens of a rollout's earlier calls in later prompts (no
    re-tokenization drift; consecutive calls then merge into one training sample)."""
    seed: int = 0
    """Seed for requests that do not set one."""


EngineConfig = EmbeddedEngineConfig


class GatewayConfig(Section):
    """The OpenAI-compatible endpoint the app's model calls go to."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port; 0 picks a free one."""
    api_key: str | None = "auto"
    """`auto`: a random per-run key; a string: that key; null: no authentication."""
