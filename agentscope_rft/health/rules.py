"""The built-in health rules: pure functions over the run's step metrics.

A rule gets the history of the run's training steps (oldest first; the last entry is the step
just finished) and its settings, and returns a `Finding` when the rule is broken for
`settings.patience` steps in a row, else None. A rule whose metric was not logged never fires.
Your own rules have the same shape (`health.custom`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentscope_rft.health.config import (
    DeadPolicyRule,
    EntropyCollapseRule,
    EqualRewardRule,
    KLRule,
    LogprobGapRule,
    NonFiniteRule,
    RewardCollapseRule,
    RuleSettings,
    TruncationRule,
)


@dataclass(frozen=True, slots=True)
class StepMetrics:
    """One training step's metrics, as logged."""

    step: int
    metrics: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Finding:
    """A broken rule: which metric, its value and bound, since which step, and why it matters."""

    metric: str
    value: float | None
    threshold: float | None
    message: str
    onset: int
    """The first step of the streak that broke the rule (its policy was already unhealthy)."""


Rule = Callable[[Sequence[StepMetrics], Any], "Finding | None"]


def _streak(
    history: Sequence[StepMetrics], broken: Callable[[StepMetrics], bool], patience: int
) -> int | None:
    """The onset step when the last `patience` steps all break the rule, else None."""
    if len(history) < patience or not all(broken(h) for h in history[-patience:]):
        return None
    onset = len(history) - patience
    while onset > 0 and broken(history[onset - 1]):
        onset -= 1
    return history[onset].step


def _value(entry: StepMetrics, name: str) -> float | None:
    value = entry.metrics.get(name)
    return None if value is None else float(value)


def non_finite(history: Sequence[StepMetrics], cfg: NonFiniteRule) -> Finding | None:
    """Any NaN or infinite metric of the last step (`train/non_finite` marks a skipped update).

    Example:
        >>> non_finite([StepMetrics(0, {"loss": float("nan")})], NonFiniteRule())
        ... # doctest: +ELLIPSIS
        Finding(metric='loss', value=nan, ...)
    """

    def bad(entry: StepMetrics) -> str | None:
        if entry.metrics.get("train/non_finite"):
            return "train/non_finite"
        return next((k for k, v in entry.metrics.items() if not math.isfinite(v)), None)

    onset = _streak(history, lambda h: bad(h) is not None, cfg.patience)
    if onset is None:
        return None
    metric = bad(history[-1]) or ""
    return Finding(
        metric,
        _value(history[-1], metric),
        None,
        f"{metric} is not finite: the update diverged (lower trainer.lr, raise trainer.grad_clip)",
        onset,
    )


def _entropy(entry: StepMetrics) -> float | None:
    """The trainer's `entropy/mean`, else (a step the trainer skipped) the explorer's
    `entropy/sampled` (mean surprisal of the sampled tokens: the same entropy, estimated)."""
    value = _value(entry, "entropy/mean")
    return value if value is not None else _value(entry, "entropy/sampled")


def entropy_collapse(history: Sequence[StepMetrics], cfg: EntropyCollapseRule) -> Finding | None:
    """`entropy/mean` below `fraction` x the mean of the run's first `baseline_steps` steps, on
    steps whose episodes succeed less often than `converged_success` (a policy that solves its
    tasks may stop exploring).

    Example:
        >>> steps = [StepMetrics(i, {"entropy/mean": e}) for i, e in enumerate([1.6, 1.4, .2, .1])]
        >>> entropy_collapse(steps, EntropyCollapseRule()).onset
        2
        >>> solved = {"entropy/mean": 0.1, "success_rate": 0.95}
        >>> entropy_collapse([*steps[:3], StepMetrics(3, solved)], EntropyCollapseRule()) is None
        True
    """
    logged = [h for h in history if _entropy(h) is not None]
    if len(logged) <= cfg.baseline_steps:
        return None
    baseline = sum(_entropy(h) or 0.0 for h in logged[: cfg.baseline_steps])
    baseline /= cfg.baseline_steps
    bound = cfg.fraction * baseline
    later = logged[cfg.baseline_steps :]

    def collapsed(entry: StepMetrics) -> bool:
        success, enough = _value(entry, "success_rate"), cfg.converged_success
        if success is not None and enough is not None and success >= enough:
            return False
        return (_entropy(entry) or 0.0) < bound

    onset = _streak(later, collapsed, cfg.patience)
    if onset is None:
        return None
    value = _entropy(later[-1])
    return Finding(
        "entropy/mean",
        value,
        bound,
        f"policy entropy {value:.3g} fell below {cfg.fraction:g} x its start ({baseline:.3g}): "
        "the policy stopped exploring (lower trainer.lr, add algorithm.entropy_coef or a KL loss)",
        onset,
    )


def _above(
    history: Sequence[StepMetrics],
    metric: str,
    bound: float,
    patience: int,
    message: Callable[[float], str],
) -> Finding | None:
    """A finding when `metric` was above `bound` for the last `patience` steps, explained by
    `message(value)`."""

    def broken(h: StepMetrics) -> bool:
        value = _value(h, metric)
        return value is not None and value > bound

    onset = _streak(history, broken, patience)
    if onset is None:
        return None
    value = _value(history[-1], metric) or 0.0
    return Finding(metric, value, bound, message(value), onset)


def logprob_gap(history: Sequence[StepMetrics], cfg: LogprobGapRule) -> Finding | None:
    """`train/rollout_trainer_logprob_diff` above `max`."""
    return _above(
        history,
        "train/rollout_trainer_logprob_diff",
        cfg.max,
        cfg.patience,
        lambda value: (
            f"engine and trainer log-probs differ by {value:.3g} per token "
            f"(> {cfg.max:g}): the trainer is not training the policy that explored (weight sync, "
            "dtype or chat template)"
        ),
    )


def _equal_share(entry: StepMetrics) -> float | None:
    """Share of the step's groups with all-equal rewards (dynamic sampling's count first)."""
    tasks, equal = _value(entry, "explore/tasks"), _value(entry, "explore/groups_equal_reward")
    if tasks and equal is not None:
        return equal / tasks
    groups, zero = _value(entry, "train/groups"), _value(entry, "train/zero_variance_groups")
    if groups and zero is not None:
        return zero / groups
    return None


def equal_rewards(history: Sequence[StepMetrics], cfg: EqualRewardRule) -> Finding | None:
    """Share of equal-reward groups above `max_share`.

    Example:
        >>> steps = [StepMetrics(0, {"train/groups": 4, "train/zero_variance_groups": 4})]
        >>> equal_rewards(steps, EqualRewardRule(patience=1)).value
        1.0
    """

    def broken(h: StepMetrics) -> bool:
        share = _equal_share(h)
        return share is not None and share > cfg.max_share

    onset = _streak(history, broken, cfg.patience)
    if onset is None:
        return None
    share = _equal_share(history[-1])
    return Finding(
        "health/equal_reward_share",
        share,
        cfg.max_share,
        f"{(share or 0) * 100:.0f}% of groups had equal rewards for {cfg.patience} steps: the "
        "tasks are too easy or too hard for the policy, nothing is learned from them (see "
        "explorer.dynamic_sampling, or easier/harder tasks)",
        onset,
    )


def truncation(history: Sequence[StepMetrics], cfg: TruncationRule) -> Finding | None:
    """Share of calls that hit their token limit above `max_rate`."""
    return _above(
        history,
        "response_length/clip_ratio",
        cfg.max_rate,
        cfg.patience,
        lambda value: (
            f"{value * 100:.0f}% of model calls stopped at their token limit: replies "
            "are degenerating (padding to the limit) or the limit is too low "
            "(explorer.sampling.max_tokens)"
        ),
    )


def kl(history: Sequence[StepMetrics], cfg: KLRule) -> Finding | None:
    """`kl/mean` above `max`."""
    return _above(
        history,
        "kl/mean",
        cfg.max,
        cfg.patience,
        lambda value: (
            f"KL to the reference policy is {value:.3g} (> {cfg.max:g}): the policy "
            "drifted far (raise algorithm.kl.coef or lower trainer.lr)"
        ),
    )


def reward_collapse(history: Sequence[StepMetrics], cfg: RewardCollapseRule) -> Finding | None:
    """The reward's moving average below (1 - drop) x its best moving average so far.

    Example:
        >>> rewards = [0.1, 0.6, 0.8, 0.8, 0.1, 0.0]
        >>> steps = [StepMetrics(i, {"reward/mean": r}) for i, r in enumerate(rewards)]
        >>> reward_collapse(steps, RewardCollapseRule(window=2)).onset
        4
    """
    rewards = [(h.step, _value(h, "reward/mean")) for h in history]
    points = [(step, r) for step, r in rewards if r is not None]
    if len(points) < cfg.window:
        return None
    averages = [
        (points[i][0], sum(r for _, r in points[i - cfg.window + 1 : i + 1]) / cfg.window)
        for i in range(cfg.window - 1, len(points))
    ]
    best = -math.inf
    onset_index = None
    for index, (_, average) in enumerate(averages):
        collapsed = best >= cfg.min_best and average < (1 - cfg.drop) * best
        if collapsed:
            onset_index = index if onset_index is None else onset_index
        else:
            onset_index = None
            best = max(best, average)
    if onset_index is None or len(averages) - onset_index < cfg.patience:
        return None
    # The first step whose reward entered the collapsed average.
    first = averages[onset_index][0]
    window_steps = [s for s, _ in points if s <= first][-cfg.window :]
    drops = [s for s in window_steps if (dict(points)[s]) < (1 - cfg.drop) * best]
    onset = drops[0] if drops else first
    value = averages[-1][1]
    return Finding(
        "reward/mean",
        value,
        (1 - cfg.drop) * best,
        f"the reward's {cfg.window}-step average fell to {value:.3g} from its best {best:.3g}",
        onset,
    )


def _learning_signal(entry: StepMetrics) -> bool | None:
    """Whether some trained group's rewards differ (a non-zero advantage), None if unknown."""
    groups = _value(entry, "advantage/num_groups")
    flat = _value(entry, "advantage/zero_variance_groups")
    if groups is not None and flat is not None:
        return groups > flat
    share = _equal_share(entry)
    return None if share is None else share < 1


def dead_policy(history: Sequence[StepMetrics], cfg: DeadPolicyRule) -> Finding | None:
    """`grad_norm` exactly 0 on steps that trained tokens (`train/trained_tokens`) some of which
    carry a non-zero advantage: the policy no longer moves (a learning rate far too high leaves
    it saturated, entropy at its maximum). A step without those metrics never breaks the rule.

    Example:
        >>> dead = {"grad_norm": 0.0, "train/trained_tokens": 64, "advantage/num_groups": 2,
        ...         "advantage/zero_variance_groups": 0}
        >>> dead_policy([StepMetrics(i, dead) for i in range(3)], DeadPolicyRule()).onset
        0
        >>> flat = {**dead, "advantage/zero_variance_groups": 2}  # nothing to learn: no update
        >>> dead_policy([StepMetrics(i, flat) for i in range(3)], DeadPolicyRule()) is None
        True
    """

    def broken(entry: StepMetrics) -> bool:
        trained = _value(entry, "train/trained_tokens")
        return (
            _value(entry, "grad_norm") == 0.0
            and not entry.metrics.get("train/skipped")
            and trained is not None
            and trained > 0
            and _learning_signal(entry) is True
        )

    onset = _streak(history, broken, cfg.patience)
    if onset is None:
        return None
    entropy = _entropy(history[-1])
    seen = "" if entropy is None else f", policy entropy {entropy:.3g}"
    return Finding(
        "grad_norm",
        0.0,
        0.0,
        f"the gradient norm was 0 for {cfg.patience} steps while rewards within groups differed"
        f"{seen}: the policy is dead (its activations saturated, no update moves it), most "
        "likely from a trainer.lr far too high (the default is 1e-6); lower trainer.lr and "
        f"start again, or fork a checkpoint from before step {onset} (`--fork-from`)",
        onset,
    )


BUILTIN_RULES: dict[str, Rule] = {
    "non_finite": non_finite,
    "entropy_collapse": entropy_collapse,
    "logprob_gap": logprob_gap,
    "equal_rewards": equal_rewards,
    "truncation": truncation,
    "kl": kl,
    "reward_collapse": reward_collapse,
    "dead_policy": dead_policy,
}
"""Rule name (a key of `health.rules`) -> its function."""


def rule_function(name: str, settings: RuleSettings) -> Callable[[Sequence[StepMetrics]], Any]:
    """The rule as a function of the history alone (a custom rule is imported here)."""
    from agentscope_rft.health.config import CustomRule

    if isinstance(settings, CustomRule):
        from agentscope_rft.api import load_callable

        fn = load_callable(settings.path, "health rule")
        if not callable(fn):
            raise ValueError(f"health rule {settings.path!r} is not callable")
        params = dict(settings.params)
        return lambda history: fn(history, params)
    builtin = BUILTIN_RULES[name]
    return lambda history: builtin(history, settings)
