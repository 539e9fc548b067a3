"""`run.deterministic`: two runs with one seed give the same metrics (embedded engine, torch
trainer, `run.mode: sync`); see docs/lifecycle.md, "Deterministic repeats".

What varies between two runs of one config without it, and what this module does about it:

- The embedded engine picks its CPU threads per forward size by measured time, and its dtype
  (`auto` on CPU) by a timed matmul: both are fixed here (all of torch's threads, float32).
- The engine's fp32 logits depend at ~1e-7 on which requests shared a batch and on whether a
  prompt's prefix came from the prefix cache, and timing decides both. That flips sampled
  tokens (on a flat distribution, often: tokens 2e-5 apart in the inverse CDF) and reaches the
  loss through the rollout log-probs, and Adam (which divides by the gradient's size) grows it
  into different weights within a few steps. Here the engine computes each request alone
  (`max_batch_size: 1`, no prefix cache): the price of determinism, in speed. Episodes then
  run one after another (`explorer.max_concurrency: 1`): run together, they would only queue
  for the engine, and a long queue runs into `explorer.episode_timeout`.
- Samples reach the trainer in a fixed order (`ordered`: by rollout number, then call), not in
  the order their episodes finished or the buffer returned them.
- `torch.use_deterministic_algorithms` (CUDA: with the cuBLAS workspace it needs).

What still varies is said once at start (`_warn_what_varies`) and in the docs.

Example:
    >>> config = deterministic_config(config)  # doctest: +SKIP
    >>> samples = ordered(samples)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

import torch

from agentscope_rft.config import EmbeddedEngineConfig, RunConfig
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

VARYING_METRICS = (
    "time",
    "time/",
    "tokens_per_s",
    "rollouts_per_s",
    "engine/decode_steps",
    "engine/prefill_",
    "engine/prefix_cache/",
    "engine/running",
    "engine/waiting",
    "engine/threads/",
    "memory/",
    "explore/loop_lag_max",
)
"""Metric names (or prefixes) that `run.deterministic` does not make repeat: wall time and
throughput, the process's memory, the event loop's lag, and the engine's queue and batching
counters (timing decides them)."""


def repeats(name: str) -> bool:
    """Whether metric `name` is one that two deterministic runs give equal."""
    return not any(
        name == p or (p.endswith(("/", "_")) and name.startswith(p)) for p in VARYING_METRICS
    )


def deterministic_config(config: RunConfig) -> RunConfig:
    """`config` with the settings that repeat fixed (each change said in a log line), and torch
    switched to deterministic algorithms. A no-op unless `run.deterministic`."""
    if not config.run.deterministic:
        return config
    engine, explorer = config.engine, config.explorer
    if isinstance(engine, EmbeddedEngineConfig):
        changes: dict[str, object] = {}
        if engine.num_threads is None:
            changes["num_threads"] = max(1, torch.get_num_threads())
            logger.info(
                "run.deterministic: engine.num_threads fixed at %d (auto picks by measured time)",
                changes["num_threads"],
            )
        on_cpu = engine.device == "cpu" or (
            engine.device == "auto" and not torch.cuda.is_available()
        )
        if engine.dtype == "auto" and on_cpu:
            changes["dtype"] = "float32"
            logger.info("run.deterministic: engine.dtype auto -> float32 (auto times a matmul)")
        if engine.max_batch_size > 1 or engine.prefix_caching:
            changes.update(max_batch_size=1, prefix_caching=False)
            logger.info(
                "run.deterministic: engine.max_batch_size 1, prefix_caching off: each request is "
                "computed alone (fp32 results depend on the batch and on cached prefixes, and "
                "timing decides both)"
            )
        if changes:
            engine = engine.model_copy(update=changes)
        if explorer.max_concurrency > 1:
            explorer = explorer.model_copy(update={"max_concurrency": 1})
            logger.info(
                "run.deterministic: explorer.max_concurrency 1: episodes run one after another "
                "(with requests computed alone, concurrent episodes only queue for the engine, and "
                "queueing runs into explorer.episode_timeout, whose timeouts do not repeat)"
            )
    trainer = config.trainer
    if getattr(trainer, "memory_budget_gib", None) and getattr(
        trainer, "memory_budget_measured", False
    ):
        trainer = trainer.model_copy(update={"memory_budget_measured": False})
        logger.info(
            "run.deterministic: trainer.memory_budget_measured off (measured memory varies, and "
            "with it the micro-batch sizes)"
        )
    # cuBLAS needs a fixed workspace for deterministic matmuls; set before CUDA initializes.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    _warn_what_varies(config)
    return config.model_copy(update={"engine": engine, "explorer": explorer, "trainer": trainer})


def _warn_what_varies(config: RunConfig) -> None:
    reasons = []
    if config.run.mode != "sync":
        reasons.append(
            f"run.mode {config.run.mode}: the explorer runs ahead, so which policy version "
            "answers each call follows timing"
        )
    if config.engine.type != "embedded":
        reasons.append(f"engine {config.engine.type}: its batching and kernels follow timing")
    if config.trainer.type != "torch":
        reasons.append(f"trainer {config.trainer.type}: distributed reductions")
    if config.runtime.type != "local":
        reasons.append(f"runtime {config.runtime.type}: episodes on other processes")
    for reason in reasons:
        logger.warning("run.deterministic: metrics will not repeat exactly: %s", reason)
    logger.info(
        "run.deterministic: episodes that time out (explorer.episode_timeout) or are retried "
        "still differ between runs; so do engine batching metrics and wall times"
    )


def _natural(text: str) -> tuple[tuple[int, str], ...]:
    """`s2.10` after `s2.9`: digits compare as numbers."""
    return tuple(
        (int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", text)
    )


def ordered(samples: Sequence[Sample]) -> list[Sample]:
    """`samples` in an order that does not depend on timing: by policy version, rollout id
    (batch, then task and rollout number: `s3.12` is step 3's 13th episode) and sample id; a
    rollout's samples keep their order (the sort is stable). Demonstrations and preference
    pairs (not `kind == "rl"`, or with a `pair_id`) come from files in a fixed order: they stay
    as they are, after the rollouts.

    Example:
        >>> [s.rollout_id for s in ordered(samples)]  # doctest: +SKIP
        ['s0.0', 's0.1', 's0.2', 's0.10']
    """
    rollouts = [s for s in samples if s.kind == "rl" and s.pair_id is None]
    rest = [s for s in samples if not (s.kind == "rl" and s.pair_id is None)]
    return sorted(rollouts, key=_rollout_order) + rest


def _rollout_order(sample: Sample) -> tuple[object, ...]:
    return (sample.policy_version, _natural(sample.rollout_id), _natural(sample.sample_id))
