"""`samples.jsonl`: the training samples of each explored step, token by token.

One line per sample: the `Sample` fields (`token_ids`, `loss_mask`, `logprobs`, `reward`,
`token_rewards`, ids, ...) plus `step`, `phase`, the `advantages` the run's estimator gives each
token (computed here with the same function the trainer calls, before any KL-in-reward penalty;
`null` for estimators that need a critic), `call_spans` (the `[start, end)` token range of each
call's completion) and `break_reason` (why the sample did not continue the agent's previous
sample, as the `TrajectoryBuilder` counts it). The dashboard's trajectory viewer reads it, and
reviews in the dashboard turn its samples back into training data (`offline.format: review`).

At most `monitor.sample_log` samples per step are written (whole advantage groups, in order);
0 turns the file off. Lines go out in one unbuffered write per step, like `rollouts.jsonl`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.algorithms.config import AlgorithmConfig
from agentscope_rft.buffer.base import group_samples
from agentscope_rft.explorer.explorer import ExploreResult
from agentscope_rft.monitor.records import drop_partial_last_line
from agentscope_rft.monitor.samples_file import SAMPLES_FILE
from agentscope_rft.trainers.batch import build_batch, trained_runs
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)


class SampleLog:
    """Appends the samples of each explored step to `<run_dir>/samples.jsonl`.

    Example:
        >>> log = SampleLog(Path("runs/demo"), AlgorithmConfig(), limit=64)  # doctest: +SKIP
        >>> log.write(3, explore_result)  # doctest: +SKIP
    """

    def __init__(
        self, run_dir: Path, algorithm: AlgorithmConfig, *, limit: int, resume: bool = False
    ) -> None:
        self.path = run_dir / SAMPLES_FILE
        self.algorithm = algorithm
        self.limit = limit
        if resume:
            drop_partial_last_line(self.path)

    def write(self, step: int, result: ExploreResult, phase: str = "train") -> None:
        """Log up to `limit` of the step's samples (whole groups first)."""
        if not self.limit or not result.samples:
            return
        chosen: list[Sample] = []
        for group in group_samples(result.samples).values():
            if chosen and len(chosen) + len(group) > self.limit:
                break
            chosen += group[: self.limit - len(chosen)]
        advantages = token_advantages(chosen, self.algorithm)
        breaks = break_reasons(chosen)
        lines = [
            json.dumps(sample_line(step, phase, s, adv, breaks.get(s.sample_id)))
            for s, adv in zip(chosen, advantages, strict=True)
        ]
        with open(self.path, "ab", buffering=0) as handle:
            handle.write(("\n".join(lines) + "\n").encode("utf-8"))


def sample_line(
    step: int, phase: str, sample: Sample, advantages: list[float] | None, break_reason: str | None
) -> dict[str, Any]:
    """The JSON record of one sample (rounded floats keep the file small)."""
    line: dict[str, Any] = {"step": step, "phase": phase, **sample.to_dict()}
    line["logprobs"] = [round(x, 4) for x in sample.logprobs]
    line["advantages"] = None if advantages is None else [round(x, 4) for x in advantages]
    line["call_spans"] = [list(run) for run in trained_runs(sample.loss_mask)]
    line["break_reason"] = break_reason
    return line


def token_advantages(
    samples: Sequence[Sample], algorithm: AlgorithmConfig
) -> list[list[float] | None]:
    """Per-token advantages of each sample under the run's estimator (0 on masked tokens);
    None for every sample when the estimator cannot run without the trainer (a critic)."""
    from agentscope_rft.trainers.common import batch_advantages

    rl = [s for s in samples if s.kind == "rl" and s.num_trained_tokens and s.loss_mask[0] == 0]
    if not rl or not algorithm.is_rl():
        return [None] * len(samples)
    try:
        batch = build_batch(rl, pad_id=0)
        advantages, _ = batch_advantages(batch, batch.rollout_logprobs, None, None, algorithm, {})
    except Exception as exc:  # e.g. GAE needs the critic's values; the log must not stop a run
        logger.debug("samples.jsonl: no advantages (%s: %s)", type(exc).__name__, exc)
        return [None] * len(samples)
    rows = {id(s): i for i, s in enumerate(rl)}
    out: list[list[float] | None] = []
    for s in samples:
        row = rows.get(id(s))
        out.append(None if row is None else advantages[row, : len(s.token_ids)].tolist())
    return out


def break_reasons(samples: Sequence[Sample]) -> dict[str, str]:
    """Why each sample after an agent's first did not continue the one before it, read from the
    tokens the way `explorer.trajectory` decides it (`settings_changed`, `max_length`,
    `history_rewritten`, `completion_retokenized`)."""
    reasons: dict[str, str] = {}
    previous: dict[tuple[str, str | None], Sample] = {}
    for sample in samples:
        key = (sample.rollout_id, sample.agent_name)
        before = previous.get(key)
        previous[key] = sample
        if before is None:
            continue
        runs = trained_runs(sample.loss_mask)
        prompt = list(sample.token_ids[: runs[0][0]]) if runs else list(sample.token_ids)
        earlier = list(before.token_ids)
        if sample.temperature != before.temperature:
            reasons[sample.sample_id] = "settings_changed"
        elif prompt[: len(earlier)] == earlier:
            reasons[sample.sample_id] = "max_length"
        else:
            limit = min(len(earlier), len(prompt))
            diff = next((i for i in range(limit) if earlier[i] != prompt[i]), limit)
            before_runs = trained_runs(before.loss_mask)
            last_completion = before_runs[-1][0] if before_runs else len(earlier)
            reasons[sample.sample_id] = (
                "history_rewritten" if diff < last_completion else "completion_retokenized"
            )
    return reasons
