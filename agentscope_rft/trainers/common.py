"""The algorithm side of a training step, shared by every trainer backend (torch, verl).

A backend owns the model: forward/backward, the optimizer, the weights. Everything decided from
the batch alone lives here once, so both backends train the same way: which groups are dropped,
the advantages, the mini-batch split, the learning-rate schedule and the step's metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentscope_rft.algorithms import (
    AdvantageInputs,
    AlgorithmConfig,
    apply_kl_penalty,
    compute_advantages,
    kl_estimate,
    zero_variance_groups,
)
from agentscope_rft.config import TrainerSettings
from agentscope_rft.trainers.batch import TrainBatch, build_batch
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LRSchedule:
    """The LR multiplier at an optimizer step: linear warm-up, then constant/linear/cosine decay.

    A plain object (not a closure) so it pickles into verl's Ray workers and checkpoints.

    Example:
        >>> factor = LRSchedule("linear", warmup_steps=1, min_lr_ratio=0.0, total_steps=3)
        >>> [round(factor(s), 3) for s in range(4)]
        [0.5, 1.0, 0.5, 0.0]
    """

    kind: str
    warmup_steps: int
    min_lr_ratio: float
    total_steps: int

    @classmethod
    def of(cls, settings: TrainerSettings, optimizer_steps: int) -> LRSchedule:
        return cls(
            settings.lr_schedule, settings.warmup_steps, settings.min_lr_ratio, optimizer_steps
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        decay = (
            1.0 - progress if self.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        )
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay


def total_optimizer_steps(settings: TrainerSettings, steps: int) -> int:
    """Optimizer steps of a run of `steps` training steps (epochs x mini-batches each)."""
    return steps * settings.mini_batches * settings.epochs


def count_groups(samples: Sequence[Sample]) -> int:
    return len({(s.group, s.agent_name) for s in samples})


def _groups(samples: Sequence[Sample]) -> str:
    """What the trainer's groups are, as the step line says it: one per task, or, in a
    multi-agent app, one per task and agent (the run's diagnosis counts task groups)."""
    rl = [s for s in samples if s.kind == "rl"]
    tasks = len({s.group for s in rl})
    if count_groups(rl) == tasks:
        return "groups"
    return f"advantage groups (one per task and agent, over {tasks} task group(s))"


def drop_zero_variance(
    samples: Sequence[Sample], algorithm: AlgorithmConfig, pad_id: int
) -> tuple[list[Sample], int]:
    """The samples without groups whose scores are all equal (when the algorithm drops them),
    and the number of groups dropped."""
    if not algorithm.drops_zero_variance_groups():
        return list(samples), 0
    probe = build_batch(samples, pad_id)
    scores = probe.rewards + probe.token_rewards.sum(dim=1)
    flat = zero_variance_groups(scores, probe.group_ids) & (probe.sample_kinds == 0)
    dropped_groups = len(set(probe.group_ids[flat].tolist()))
    kept = [s for s, drop in zip(samples, flat.tolist(), strict=True) if not drop]
    return kept, dropped_groups


def mask_nonfinite_logprobs(samples: Sequence[Sample], step: int) -> tuple[list[Sample], int]:
    """The samples with trained tokens whose recorded log-prob is NaN or inf left untrained, and
    how many tokens that was (a warning says so).

    Such a log-prob (an engine's numerical fault) would make the PPO ratio, TIS weight and GSPO's
    sequence ratio NaN or huge, and with them the step's loss.

    Example:
        >>> kept, masked = mask_nonfinite_logprobs(samples, step=3)  # doctest: +SKIP
    """
    out: list[Sample] = []
    masked, first = 0, ""
    for sample in samples:
        if math.isfinite(sum(sample.logprobs)):  # (log-probs are bounded: no overflow)
            out.append(sample)
            continue
        bad = [
            t
            for t, (m, lp) in enumerate(zip(sample.loss_mask, sample.logprobs, strict=True))
            if m and not math.isfinite(lp)
        ]
        if not bad:
            out.append(sample)
            continue
        first = first or f"sample {sample.sample_id or sample.rollout_id}, token {bad[0]}"
        masked += len(bad)
        mask, logprobs = list(sample.loss_mask), list(sample.logprobs)
        for t in bad:
            mask[t], logprobs[t] = 0, 0.0
        out.append(dataclasses.replace(sample, loss_mask=mask, logprobs=logprobs))
    if masked:
        logger.warning(
            "step %d: %d trained tokens have a non-finite log-prob from the engine (first: %s); "
            "they are not trained",
            step,
            masked,
            first,
        )
    return out, masked


def filter_step_samples(
    samples: Sequence[Sample], algorithm: AlgorithmConfig, pad_id: int, step: int
) -> tuple[list[Sample], dict[str, float]]:
    """A step's first move in every trainer: leave tokens with a non-finite recorded log-prob
    untrained, drop zero-variance groups, and count both.

    Returns the samples to train on and the step's group metrics; `train/skipped` is set (and
    a warning logged) when nothing is left to train on.
    """
    samples, masked = mask_nonfinite_logprobs(samples, step)
    kept, dropped = drop_zero_variance(samples, algorithm, pad_id)
    metrics = {
        "train/groups": float(count_groups(samples)),
        "train/zero_variance_groups": float(dropped),
    }
    if masked:
        metrics["train/nonfinite_logprob_tokens"] = float(masked)
    if not kept:
        logger.warning(
            "step %d: all %d %s had equal rewards; no update", step, dropped, _groups(samples)
        )
        metrics["train/skipped"] = 1.0
    return kept, metrics


def batch_advantages(
    batch: TrainBatch,
    old: Tensor,
    ref: Tensor | None,
    values: Tensor | None,
    algorithm: AlgorithmConfig,
    metrics: dict[str, float],
) -> tuple[Tensor, Tensor | None]:
    """Advantages [N, T] of the batch's RL rows (zeros elsewhere) and GAE returns; adds the
    estimator's metrics to `metrics`. `old`, `ref`, `values` are [N, T] like the batch."""
    advantages = torch.zeros(batch.input_ids.shape)
    if not algorithm.is_rl():
        return advantages, None
    rl = (batch.sample_kinds == 0).nonzero().squeeze(-1)
    if rl.numel() == 0:  # sft_rl_mix with every RL group dropped as equal: an SFT-only step
        return advantages, None
    token_rewards = batch.token_rewards[rl]
    if algorithm.kl is not None and algorithm.kl.apply_to == "reward" and ref is not None:
        kl = kl_estimate(old[rl], ref[rl], algorithm.kl.estimator)
        token_rewards = apply_kl_penalty(token_rewards, kl, batch.loss_mask[rl], algorithm.kl.coef)
    out = compute_advantages(
        AdvantageInputs(
            rewards=batch.rewards[rl],
            group_ids=batch.group_ids[rl],
            episode_ids=batch.episode_ids[rl],
            loss_mask=batch.loss_mask[rl],
            token_rewards=token_rewards,
            values=values[rl] if values is not None else None,
            step_state_ids=batch.step_state_ids[rl],
        ),
        algorithm,
    )
    advantages[rl] = out.advantages
    metrics.update(out.metrics)
    returns = None
    if out.returns is not None:
        returns = torch.zeros(batch.input_ids.shape)
        returns[rl] = out.returns
    return advantages, returns


def mini_batch_rows(batch: TrainBatch, mini_batches: int) -> list[list[int]]:
    """Rows of each mini-batch (one optimizer step each); the same split serves every epoch.

    The units dealt are rows, or a DPO pair's two rows (its loss needs both), in one random
    permutation (the global torch RNG, so a seeded run repeats), round-robin. Rows without a
    trained token (their episode still counted in the advantages' baselines) go to none: a
    mini-batch of only such rows would have nothing to train. With fewer units than
    `mini_batches`, there are fewer mini-batches.

    Example:
        >>> mini_batch_rows(batch, mini_batches=2)  # doctest: +SKIP
        [[3, 0], [1, 2]]
    """
    trained = batch.loss_mask.bool().any(dim=1).tolist()
    units: dict[int, list[int]] = {}
    for row, pair in enumerate(batch.pair_index.tolist()):
        units.setdefault(pair, []).append(row)
    dealt = [unit for unit in units.values() if any(trained[row] for row in unit)]
    order = torch.randperm(len(dealt)).tolist()
    parts = [[row for k in order[j::mini_batches] for row in dealt[k]] for j in range(mini_batches)]
    return [part for part in parts if part]


@dataclass
class LogprobGap:
    """The engine-vs-trainer log-prob gap of a step, measured only where it means something.

    `rows` ([N] bool, `LogprobGap.of`) are the RL samples every call of which the engine sampled
    with the weights the trainer holds at the step: only their log-probs should match the
    trainer's. A stale sample (`one_step_off`, `async`, `train_only`, replay) differs by the
    policy's own change since it was explored, which is no engine mismatch. `sum` and `tokens`
    collect |trainer - engine| over the trained tokens of `rows` on the step's first update
    (before any weight changed).
    """

    version: int  # the trainer's weights at the step: the run's policy version at step s is s
    rows: Tensor  # [N] bool
    lag: Tensor  # [N] long: version - sample.policy_version
    rl: Tensor  # [N] bool: samples the engine sampled (not demonstrations or pairs)
    sum: float = 0.0
    tokens: float = 0.0

    @classmethod
    def of(cls, batch: TrainBatch, version: int) -> LogprobGap:
        """The gap to collect for `batch` trained at `version` (the step).

        Example:
            >>> gap = LogprobGap.of(batch, version=step)  # doctest: +SKIP
        """
        versions = torch.tensor([s.policy_version for s in batch.samples], dtype=torch.long)
        rl = batch.sample_kinds == 0
        lag = version - versions
        return cls(version, rl & (lag == 0), lag, rl)


def batch_metrics(
    batch: TrainBatch,
    old: Tensor,
    ref: Tensor | None,
    recomputed: bool,
    gap: LogprobGap,
) -> dict[str, float]:
    """Rollout-vs-trainer log-prob gap, staleness, and KL to the reference.

    The gap is over the recomputed old log-probs, else over the first update's forward (`gap`'s
    sums: free), of the samples explored by the trainer's weights (`LogprobGap.rows`); a step
    without any logs no gap. `train/stale_samples` counts the RL samples explored by older
    weights and `train/staleness_max` the most versions any is behind.
    """
    mask = batch.loss_mask.bool()
    lags = gap.lag[gap.rl]
    out = {
        "train/stale_samples": float((lags > 0).sum()),
        "train/staleness_max": float(lags.max()) if len(lags) else 0.0,
    }
    measured = mask & gap.rows[:, None]
    if recomputed and bool(measured.any()):
        diff = (batch.rollout_logprobs - old)[measured].abs().mean()
        out["train/rollout_trainer_logprob_diff"] = float(diff)
    elif not recomputed and gap.tokens:
        out["train/rollout_trainer_logprob_diff"] = gap.sum / gap.tokens
    if ref is not None:
        out["kl/mean"] = float(kl_estimate(old, ref, "k3")[mask].mean())
    return out


def step_metrics(
    sums: Mapping[str, float], updates: int, batch: TrainBatch, elapsed: float
) -> dict[str, float]:
    """Metrics of a finished step from the sums over its optimizer updates.

    `sums` holds per-update values summed over updates (averaged here), plus `entropy/sum` and
    `entropy/tokens` (entropy over trained tokens, summed over all updates).
    """
    values = dict(sums)
    entropy_sum = values.pop("entropy/sum", 0.0)
    entropy_tokens = values.pop("entropy/tokens", 0.0)
    out = {"entropy/mean": entropy_sum / max(entropy_tokens, 1.0)}
    out.update({k: v / updates for k, v in values.items()})
    out.update(
        {
            "train/samples": float(len(batch.samples)),
            "train/tokens": float(batch.num_tokens),
            "train/trained_tokens": float(batch.loss_mask.sum()),
            "tokens_per_s": batch.num_tokens * updates / elapsed,
            "time/train": elapsed,
        }
    )
    return out
