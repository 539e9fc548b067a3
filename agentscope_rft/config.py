"""Run configuration: one pydantic model per component, loaded from short YAML.

Defaults live only here. Unknown keys are errors with a did-you-mean suggestion.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

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


class VLLMEngineConfig(Section):
    """vLLM OpenAI servers in their own process (and environment), started and supervised."""

    type: Literal["vllm"] = "vllm"
    python: str | None = None
    """Interpreter with vLLM; default `$AGENTSCOPE_RFT_VLLM_PYTHON`, then `.venv-vllm/bin/python`
    (create it with `agentscope-rft install-vllm`)."""
    urls: list[str] = Field(default_factory=list)
    """Connect to running vLLM servers instead of starting them (`http://host:port`)."""
    replicas: int = Field(default=1, ge=1, le=64)
    """Servers to start; each rollout sticks to one (hash of its id) to reuse its prefix cache."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """First port for started servers; default: free ports."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    enforce_eager: bool = False
    """Skip CUDA graphs / torch.compile: much faster start-up, slower decoding."""
    kv_cache_space_gib: float = Field(default=2.0, gt=0)
    """KV cache size on CPU (`VLLM_CPU_KVCACHE_SPACE`)."""
    extra_args: list[str] = Field(default_factory=list)
    """More `vllm serve` arguments, passed through verbatim."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server processes."""
    startup_timeout: float = Field(default=600.0, gt=0)
    max_restarts: int = Field(default=3, ge=0)
    """Restarts of a crashed server before the engine gives up."""
    request_timeout: float = Field(default=600.0, gt=0)
    sync_mode: Literal["wait", "keep"] = "wait"
    """Weight sync: `wait` drains in-flight requests first; `keep` freezes and resumes them."""
    chat_rendering: Literal["engine", "vllm"] = "engine"
    """`engine`: our chat template and tool parser with token-id prompts (identical records to
    the embedded engine, prompt-token reuse); `vllm`: vLLM's chat endpoint and tool parser."""
    tool_call_parser: str = "hermes"
    reuse_prompt_tokens: bool = True
    enable_lora: bool = False
    """Serve LoRA adapters (weight sync loads one adapter per policy version)."""
    max_lora_rank: int = Field(default=16, ge=1)
    max_loras: int = Field(default=2, ge=1)
    weight_transfer: Literal["nccl"] | None = None
    """GPU only: stream weights from the trainer over NCCL instead of a checkpoint reload."""
    seed: int = 0


EngineConfig = Annotated[EmbeddedEngineConfig | VLLMEngineConfig, Field(discriminator="type")]


class GatewayConfig(Section):
    """The OpenAI-compatible endpoint the app's model calls go to."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port; 0 picks a free one."""
    api_key: str | None = "auto"
    """`auto`: a random per-run key; a string: that key; null: no authentication."""
