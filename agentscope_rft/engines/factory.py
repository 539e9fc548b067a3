"""Build the configured engine."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.config import EngineConfig, ModelConfig, VLLMEngineConfig
from agentscope_rft.engines.base import Engine
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.runtime.gpus import GpuPlacement


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


def build_engine(
    model: ModelConfig,
    engine: EngineConfig,
    log_dir: Path | None = None,
    gpus: GpuPlacement | None = None,
) -> Engine:
    """Create (not start) the engine for `model`.

    Example:
        >>> engine = build_engine(ModelConfig(), EmbeddedEngineConfig())  # doctest: +SKIP
    """
    template = read_chat_template(model.chat_template)
    if isinstance(engine, VLLMEngineConfig):
        from agentscope_rft.engines.vllm import VLLMEngine

        return VLLMEngine(
            model.name_or_path,
            python=engine.python,
            urls=engine.urls,
            replicas=engine.replicas,
            port=engine.port,
            dtype=engine.dtype,
            max_model_len=model.max_model_len,
            enforce_eager=engine.enforce_eager,
            seed=engine.seed,
            kv_cache_space_gib=engine.kv_cache_space_gib,
            extra_args=engine.extra_args,
            env=engine.env,
            startup_timeout=engine.startup_timeout,
            max_restarts=engine.max_restarts,
            request_timeout=engine.request_timeout,
            sync_mode=engine.sync_mode,
            chat_rendering=engine.chat_rendering,
            tool_call_parser=engine.tool_call_parser,
            chat_template=template,
            reuse_prompt_tokens=engine.reuse_prompt_tokens,
            reasoning_parser=engine.reasoning_parser,
            enable_lora=engine.enable_lora,
            max_lora_rank=engine.max_lora_rank,
            max_loras=engine.max_loras,
            weight_transfer=engine.weight_transfer,
            log_dir=log_dir,
            replica_gpus=gpus.replica_devices(engine.replicas) if gpus else None,
            gpu_memory_fraction=gpus.memory_fraction() if gpus else None,
            sleep_mode=gpus is not None and gpus.mode == "colocated",
        )
    return EmbeddedEngine(
        model.name_or_path,
        dtype=engine.dtype,
        device=engine.device,
        max_batch_size=engine.max_batch_size,
        max_prefill_tokens=engine.max_prefill_tokens,
        max_model_len=model.max_model_len,
        chat_template=template,
        reuse_prompt_tokens=engine.reuse_prompt_tokens,
        reasoning_parser=engine.reasoning_parser,
        seed=engine.seed,
        prefix_caching=engine.prefix_caching,
        prefix_cache_gib=engine.prefix_cache_gib,
        prefix_block_tokens=engine.prefix_block_tokens,
        prefill_chunk_tokens=engine.prefill_chunk_tokens,
        num_threads=engine.num_threads,
        fused_decode=engine.fused_decode,
        free_weights_while_training=engine.free_weights_while_training,
    )
