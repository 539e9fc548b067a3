"""`HealthConfig`: the `health:` section of a run config (rules over step metrics and actions).

Short YAML works; every rule is on with a documented default (most only warn)::

    health:
      rules:
        entropy_collapse: {action: rollback}
        truncation: {max_rate: 0.3}
      rollback: {max_rollbacks: 2, lr_factor: 0.5}
      custom:
        - {path: my_rules:reward_plateau, action: warn, params: {steps: 10}}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentscope_rft.config_base import Section

Action = Literal["off", "warn", "stop", "rollback"]
"""What a rule does when it fires: nothing, log a warning, stop the run cleanly (checkpoint
saved, resumable), or roll back to the last healthy checkpoint and continue with
`health.rollback`'s changes."""


class HealthSection(Section):
    """Base of the health config models: unknown keys fail with a did-you-mean message."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.key_label = cls.__name__


class RuleSettings(HealthSection):
    """What every rule has: its action and how many steps in a row must break it."""

    action: Action = "warn"
    """`off`, `warn`, `stop` or `rollback` (see `health.rollback`)."""
    patience: int = Field(default=1, ge=1)
    """Consecutive steps that must break the rule before it fires (its onset is the first)."""

    @field_validator("action", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare `off` (and `no`) as false: `action: off` means "off".
        return "off" if value is False else value


class NonFiniteRule(RuleSettings):
    """A NaN or infinite metric, or a non-finite gradient norm in the trainer (the step is then
    not applied)."""

    action: Action = "stop"
    """`stop` by default: an update that diverged is not worth continuing."""


class EntropyCollapseRule(RuleSettings):
    """Policy entropy (`entropy/mean`) fell below `fraction` of its value at the start of the run
    (mean of its first `baseline_steps` steps): the policy stopped exploring."""

    fraction: float = Field(default=0.2, gt=0, lt=1)
    """Fires below this share of the baseline entropy."""
    baseline_steps: int = Field(default=1, ge=1)
    """Steps at the start of the run whose mean entropy is the baseline (the first alone by
    default: at a high learning rate entropy collapses within the second step)."""
    patience: int = Field(default=2, ge=1)
    """Consecutive steps that must break the rule before it fires."""
    converged_success: float | None = Field(default=0.9, gt=0, le=1)
    """A step whose sampled episodes succeed at least this often (`success_rate`) does not break
    the rule: entropy fell because the policy solves its tasks (convergence, not a collapse), and
    rolling back would undo what it learned. `null`: entropy alone decides."""


class LogprobGapRule(RuleSettings):
    """Mean absolute gap between the engine's and the trainer's log-probs of the sampled tokens
    (`train/rollout_trainer_logprob_diff`, over the samples explored by the weights the trainer
    holds: stale ones differ by training): the trainer no longer trains the policy that explored
    (a bad weight sync, a precision or template mismatch)."""

    max: float = Field(default=0.1, gt=0)
    """Fires above this gap (nats per token; ~0.02 is normal for bf16 on CPU)."""
    patience: int = Field(default=2, ge=1)
    """Consecutive steps that must break the rule before it fires."""


class EqualRewardRule(RuleSettings):
    """Share of task groups whose rewards are all equal (a group baseline learns nothing from
    them): the tasks are too easy or too hard for the policy."""

    max_share: float = Field(default=0.9, gt=0, le=1)
    """Fires above this share of the step's groups."""
    patience: int = Field(default=5, ge=1)
    """Consecutive steps that must break the rule before it fires."""


class TruncationRule(RuleSettings):
    """Share of model calls that stopped at their token limit (`response_length/clip_ratio`):
    replies degenerate into padding to the limit."""

    max_rate: float = Field(default=0.5, gt=0, le=1)
    """Fires above this share of the step's calls."""
    patience: int = Field(default=3, ge=1)
    """Consecutive steps that must break the rule before it fires."""


class KLRule(RuleSettings):
    """KL to the reference policy (`kl/mean`, when the algorithm uses a reference) above a bound:
    the policy drifted far from where it started."""

    max: float = Field(default=1.0, gt=0)
    """Fires above this KL (k3 estimate, per token)."""
    patience: int = Field(default=2, ge=1)
    """Consecutive steps that must break the rule before it fires."""


class RewardCollapseRule(RuleSettings):
    """The reward's moving average fell by `drop` (a share) from its best so far."""

    window: int = Field(default=5, ge=1)
    """Steps in the moving average."""
    drop: float = Field(default=0.5, gt=0, le=1)
    """Fires when the moving average is below (1 - drop) x its best."""
    min_best: float = Field(default=0.1, ge=0)
    """No firing while the best moving average is below this (nothing learned yet to lose)."""


class DeadPolicyRule(RuleSettings):
    """The gradient norm (`grad_norm`) is 0 on steps that train tokens with a learning signal
    (some group's rewards differ): the update moves nothing. A learning rate far too high leaves
    such a policy: finite weights, saturated activations, entropy at its maximum, rewards at the
    floor, and no rule on the metrics' values catches it."""

    action: Action = "stop"
    """`stop` by default: no later step can train a policy whose gradients vanish."""
    patience: int = Field(default=3, ge=1)
    """Consecutive steps that must break the rule before it fires."""


class HealthRules(HealthSection):
    """The built-in rules, each with its own settings (`action: off` turns one off)."""

    non_finite: NonFiniteRule = Field(default_factory=NonFiniteRule)
    entropy_collapse: EntropyCollapseRule = Field(default_factory=EntropyCollapseRule)
    logprob_gap: LogprobGapRule = Field(default_factory=LogprobGapRule)
    equal_rewards: EqualRewardRule = Field(default_factory=EqualRewardRule)
    truncation: TruncationRule = Field(default_factory=TruncationRule)
    kl: KLRule = Field(default_factory=KLRule)
    reward_collapse: RewardCollapseRule = Field(default_factory=RewardCollapseRule)
    dead_policy: DeadPolicyRule = Field(default_factory=DeadPolicyRule)


class CustomRule(RuleSettings):
    """A rule of your own: `def rule(history: Sequence[StepMetrics], params: dict) -> Finding |
    None` (from `agentscope_rft.health`), named by import path."""

    path: str
    """`package.module:function` or `path/to/file.py:function`."""
    name: str | None = None
    """The rule's name in events and metrics (`health/<name>`), unique among the rules; default:
    the function's name."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Passed to the function as its second argument."""


class RollbackSettings(HealthSection):
    """What a rollback restores and changes."""

    max_rollbacks: int = Field(default=2, ge=0)
    """Rollbacks allowed in one run; one more firing stops the run, saying so."""
    lr_factor: float = Field(default=0.5, gt=0, le=1)
    """Multiply the learning rate by this at every rollback (1: keep it)."""
    kl_coef: float | None = Field(default=None, gt=0)
    """Set the KL-to-reference loss coefficient to this after a rollback (adds a KL loss with the
    k3 estimator when the algorithm had none); null: keep the algorithm's."""
    entropy_coef: float | None = Field(default=None, ge=0)
    """Set the entropy bonus coefficient to this after a rollback; null: keep it."""


class HealthConfig(HealthSection):
    """Run health: rules over every step's metrics, and what to do when one fires.

    Every event is logged as `health/<rule>` (1 warn, 2 stop, 3 rollback) on its step, shown on
    the console's step line, and appended to `<run_dir>/health.jsonl`.
    """

    enabled: bool = True
    """Watch the run at all."""
    rules: HealthRules = Field(default_factory=HealthRules)
    custom: list[CustomRule] = Field(default_factory=list)
    """Your own rules by import path."""
    rollback: RollbackSettings = Field(default_factory=RollbackSettings)

    @model_validator(mode="after")
    def _unique_names(self) -> HealthConfig:
        # Events, `health/<rule>` metrics and each rule's streak are keyed by the rule's name.
        seen = set(HealthRules.model_fields)
        for rule in self.custom:
            name = rule.name or rule.path.rpartition(":")[2]
            if name in seen:
                raise ValueError(
                    f"health.custom: the rule {rule.path!r} is named {name!r}, as another rule "
                    "is (events and health/<rule> metrics are keyed by name): give it its own "
                    "`name:`"
                )
            seen.add(name)
        return self

    def named_rules(self) -> list[tuple[str, RuleSettings]]:
        """(name, settings) of every rule that is on, built-in first."""
        rules: list[tuple[str, RuleSettings]] = [
            (name, getattr(self.rules, name)) for name in HealthRules.model_fields
        ]
        for rule in self.custom:
            rules.append((rule.name or rule.path.rpartition(":")[2], rule))
        return [(n, r) for n, r in rules if r.action != "off"] if self.enabled else []

    def rolls_back(self) -> bool:
        """Whether any rule that is on rolls back (the run then keeps healthy checkpoints)."""
        return any(r.action == "rollback" for _, r in self.named_rules())
