"""The `engine:` section of a run config: the embedded transformers engine or vLLM."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from agentscope_rft.config_base import Section


class EmbeddedEngineConfig(Section):
    """The embedded transformers engine (CPU or one CUDA device, in-process)."""

    type: Literal["embedded"] = "embedded"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """`auto`: bf16 on CUDA; on CPU bf16 only where the CPU has bf16 instructions (x86:
    avx512_bf16 or AMX) and it measures faster than fp32 there, else fp32. The measurement is
    made once per machine and kept in the cache folder (`cpu_bf16_speedup.json`), so every run,
    its trainer and a resumed run decide alike."""
    device: str = "auto"
    """`auto` (CUDA if available), `cpu`, `cuda` or `cuda:N`."""
    max_batch_size: int = Field(default=32, ge=1, le=1024)
    """Sequences decoded together in one batch."""
    max_prefill_tokens: int = Field(default=8192, ge=64)
    """Padded prompt tokens admitted per prefill step (bounds latency of running requests)."""
    reuse_prompt_tokens: bool = True
    """Reuse the exact sampled tokens of a rollout's earlier calls in later prompts (no
    re-tokenization drift; consecutive calls then merge into one training sample)."""
    reasoning_parser: Literal["auto", "none", "think"] = "auto"
    """Reasoning models (Qwen3, QwQ, DeepSeek-R1): `think` splits a reply's `<think>...</think>`
    off its content and returns it as `reasoning_content` (AgentScope: a `ThinkingBlock`), so the
    answer and its tool calls parse without the thinking; the training sample keeps every
    sampled token, thinking included. `auto`: `think` when the chat template writes `</think>`
    (logged); `none`: replies stay as generated. See docs/workflows.md "Reasoning models"."""
    seed: int = 0
    """Seed for requests that do not set one (follows the sweep seed of `--seeds` unless set)."""
    prefix_caching: bool = True
    """Reuse the KV of token blocks computed by earlier requests (shared system prompts, an
    episode's earlier calls): a request prefills only what is not cached. Cleared on every
    weight swap. Off for models with sliding-window or linear-attention layers."""
    prefix_cache_gib: float | None = Field(default=None, ge=0)
    """Memory for cached KV blocks (GiB, on the engine's device); least recently used blocks
    are evicted beyond it. SmolLM2-135M: ~46 KB per token in fp32, so 1 GiB holds ~23k tokens.
    null: sized from the device's free memory when the engine starts, 1/8 of it, at most 1 GiB
    (logged); the trainer in the same process needs the rest."""
    prefix_block_tokens: int = Field(default=16, ge=1, le=1024)
    """Tokens per cached block: a request reuses whole blocks of its prompt."""
    prefill_chunk_tokens: int | None = Field(default=512, ge=16)
    """A prompt with more uncached tokens than this is prefilled in chunks of this size, one
    per decode step of the running requests (so it does not stall them); null: in one go."""
    fused_decode: bool = True
    """CPU: Llama, Mistral, Qwen2 and Qwen3 models run a fused forward: decode steps with one
    matmul for q/k/v and one for gate/up, no per-layer module plumbing (15-25% faster per step);
    prefills as one unpadded batch of all admitted prompts' new tokens. bf16 results are
    bit-identical to the transformers forward of each sequence alone. Other models use
    transformers' forward (prefills padded)."""
    share_trainer_weights: bool = True
    """In a synchronous run whose torch trainer holds the policy on the engine's device and dtype
    (no LoRA), the engine computes with the trainer's weight tensors in place instead of a copy
    of its own: one copy of the weights less (0.54 GB for SmolLM2-135M in fp32) and no copying at
    each sync. The engine is held (requests wait) while the trainer steps. Logged when it cannot
    apply and why; off: the engine keeps its own copy."""
    free_weights_while_training: bool = True
    """In a synchronous run with the torch trainer (no LoRA) where the engine keeps its own copy
    of the weights (its dtype differs from the trainer's, e.g. bf16 beside the trainer's fp32
    master weights, or they are not shared), that copy and the copies derived from it
    (oneDNN-packed, fused) are freed while the trainer steps and taken from the trainer's new
    weights after it, like vLLM's sleep mode at level 2: the engine is idle then, and the sync
    after the step overwrites them anyway. SmolLM2-135M in bf16: ~0.5 GiB less at the trainer's
    peak (docs/benchmarks.md). Off: the copy stays resident."""
    num_threads: int | None = Field(default=None, ge=1)
    """CPU threads the engine computes with (its own thread only; the trainer keeps its own).
    Default: per forward size, all cores but one or all cores, whichever measures faster here,
    compared in pairs of forwards (every multi-threaded step waits whenever another thread or
    process takes a core). Engine metrics `threads/tokens_*` show the choice. With more than one
    thread, the engine keeps its OpenMP team the only lasting one in the process: the main
    thread's torch ops run single-threaded from the engine's start, and the framework's other
    torch work runs in threads that end with it (libgomp wakes every team from sleep once a
    process has more OpenMP threads than cores, which made small decode steps 2x slower)."""


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
    """Weights and compute dtype of the vLLM server."""
    enforce_eager: bool = False
    """Skip CUDA graphs / torch.compile: much faster start-up, slower decoding."""
    kv_cache_space_gib: int = Field(default=2, ge=1)
    """KV cache size on CPU in whole GiB (`VLLM_CPU_KVCACHE_SPACE`, which vLLM reads as an
    integer)."""

    @field_validator("kv_cache_space_gib", mode="before")
    @classmethod
    def _whole_gib(cls, value: object) -> object:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(
                f"vLLM takes its CPU KV cache in whole GiB (VLLM_CPU_KVCACHE_SPACE is read as an "
                f"integer: {value:g} would stop its server at start): use "
                f"{max(1, round(value))}"
            )
        return value

    extra_args: list[str] = Field(default_factory=list)
    """More `vllm serve` arguments, passed through verbatim."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server processes."""
    startup_timeout: float = Field(default=600.0, gt=0)
    """Seconds to wait for a server to become healthy: one the engine starts, or one of
    `urls`."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts of a crashed server before the engine gives up."""
    request_timeout: float = Field(default=600.0, gt=0)
    """Seconds one request to vLLM may take."""
    sync_mode: Literal["wait", "keep"] = "wait"
    """Weight sync: `wait` drains in-flight requests first; `keep` freezes and resumes them."""
    chat_rendering: Literal["engine", "vllm"] = "engine"
    """`engine`: our chat template and tool parser with token-id prompts (identical records to
    the embedded engine, prompt-token reuse); `vllm`: vLLM's chat endpoint and tool parser."""
    tool_call_parser: str = "hermes"
    """vLLM's tool-call parser (`chat_rendering: vllm` only)."""
    reuse_prompt_tokens: bool = True
    """Reuse the sampled tokens of a rollout's earlier calls in later prompts (`chat_rendering:
    engine`)."""
    reasoning_parser: Literal["auto", "none", "think"] = "auto"
    """Reasoning models (Qwen3, QwQ, DeepSeek-R1): `think` splits a reply's `<think>...</think>`
    off its content and returns it as `reasoning_content` (AgentScope: a `ThinkingBlock`), so the
    answer and its tool calls parse without the thinking; the training sample keeps every
    sampled token, thinking included. `auto`: `think` when the chat template writes `</think>`
    (logged); `none`: replies stay as generated. With `chat_rendering: vllm`, vLLM's own split
    is taken when `extra_args` has `--reasoning-parser`, else ours of its content. See
    docs/workflows.md "Reasoning models"."""
    enable_lora: bool = False
    """Serve LoRA adapters (weight sync loads one adapter per policy version)."""
    max_lora_rank: int = Field(default=16, ge=1)
    """Largest LoRA rank the server accepts (`enable_lora`)."""
    max_loras: int = Field(default=2, ge=1)
    """LoRA adapters held at once (`enable_lora`)."""
    weight_transfer: Literal["nccl"] | None = None
    """GPU only: stream weights from the trainer over NCCL instead of a checkpoint reload."""
    seed: int = 0
    """Seed of the vLLM servers (follows the sweep seed of `--seeds` unless set)."""


EngineConfig = Annotated[EmbeddedEngineConfig | VLLMEngineConfig, Field(discriminator="type")]
