"""`AlgorithmConfig`: the `algorithm:` section of a run config.

Short YAML works; a bare name stands for `{type: name}`::

    algorithm: {advantage: rloo}
    algorithm: {advantage: grpo, policy_loss: {type: gspo}, loss_agg: seq-mean-token-mean}
    algorithm: {advantage: gae, kl: {coef: 0.001, apply_to: reward}}
    algorithm: {objective: dpo, dpo: {beta: 0.1}}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from agentscope_rft.algorithms.advantages import GRPOConfig
from agentscope_rft.algorithms.aggregation import AGGREGATIONS
from agentscope_rft.algorithms.kl import KL_ESTIMATORS
from agentscope_rft.algorithms.losses import PPOClipConfig, TISConfig
from agentscope_rft.algorithms.offline import DPOConfig, SFTMixConfig
from agentscope_rft.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, parse_variant
from agentscope_rft.algorithms.spec import (
    AdvantageConfigBase,
    PolicyLossConfigBase,
    StrictModel,
    unknown_name_message,
)

Objective = Literal["rl", "sft", "dpo", "sft_rl_mix"]
OBJECTIVE_NAMES: tuple[str, ...] = ("rl", "sft", "dpo", "sft_rl_mix")
LossAgg = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


def _known_name(value: object, known: Iterable[str], kind: str) -> object:
    names = list(known)
    if isinstance(value, str) and value not in names:
        raise ValueError(unknown_name_message(kind, value, names))
    return value


class KLConfig(StrictModel):
    """KL regularization against the reference policy."""

    coef: float = Field(default=0.001, gt=0.0)
    """Weight of the KL term (loss) or penalty (reward)."""
    estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimator: k1 = log-ratio, k2 = squared/2, k3 = low-variance unbiased."""
    apply_to: Literal["loss", "reward"] = "loss"
    """`loss`: add coef * KL of the current policy to the loss (GRPO). `reward`: subtract
    coef * KL of the behaviour policy from the token rewards before advantages (PPO)."""

    @field_validator("estimator", mode="before")
    @classmethod
    def _estimator_name(cls, value: object) -> object:
        return _known_name(value, KL_ESTIMATORS, "KL estimator")


class CriticConfig(StrictModel):
    """The value head of PPO with a critic (advantage `gae`)."""

    vf_coef: float = Field(default=1.0, gt=0.0)
    """Weight of the value loss (already halved, as in verl and TRL) in the total loss."""
    value_clip: float | None = Field(default=0.5, gt=0.0)
    """Clip the new value to old value +- value_clip in the loss (None: unclipped); verl: 0.5."""
    lr_multiplier: float = Field(default=10.0, gt=0.0)
    """The critic's learning rate is the policy's times this (verl's defaults: 1e-5 vs 1e-6)."""


class AlgorithmConfig(StrictModel):
    """What to optimize and how: objective, advantage, policy loss, regularizers.

    Example:
        >>> cfg = AlgorithmConfig.model_validate({"advantage": "rloo"})
        >>> cfg.advantage.type, cfg.policy_loss.type, cfg.needs_reference()
        ('rloo', 'ppo', False)
    """

    objective: Objective = "rl"
    """`rl` (advantages + policy loss), `sft` (demonstrations), `dpo` (preference pairs), or
    `sft_rl_mix` (CHORD: RL samples and SFT samples in one batch, weights from `sft_mix`)."""
    advantage: SerializeAsAny[AdvantageConfigBase] = GRPOConfig()
    """Advantage estimator: a name or `{type: name, ...}`: grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, gae, stepwise, gigpo, or custom (`path`, `args`)."""
    policy_loss: SerializeAsAny[PolicyLossConfigBase] = PPOClipConfig()
    """Policy loss: a name or `{type: name, ...}`: ppo, gspo, cispo, or custom (`path`, `args`)."""
    loss_agg: LossAgg = "token-mean"
    """How per-token losses become one loss: token-mean, seq-mean-token-sum,
    seq-mean-token-mean, seq-mean-token-sum-norm (needs loss_agg_horizon)."""
    loss_agg_horizon: int | None = Field(default=None, ge=1)
    """Constant divisor of seq-mean-token-sum-norm, e.g. the max response length (Dr. GRPO);
    only that mode reads it (set with another mode, it is an error)."""
    normalize_per_rollout: bool = False
    """Weight each sample by 1/k when its episode was split into k samples, so long multi-call
    episodes are not over-weighted (the trainer passes `rollout_seq_weights`)."""
    kl: KLConfig | None = None
    """KL against the reference policy (None: off, and no reference model is needed)."""
    entropy_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the entropy bonus (0: off)."""
    tis: TISConfig | None = None
    """Truncated importance sampling for rollout-vs-trainer mismatch and staleness (None: off);
    acts with `trainer.old_logprobs: recompute` (with `rollout` every weight is 1)."""
    filter_zero_variance_groups: bool = True
    """Drop (and count) task groups whose rewards are all equal, for group-baseline estimators:
    their advantages are 0 and would only dilute the loss."""
    dpo: DPOConfig = DPOConfig()
    """DPO settings (objective `dpo`)."""
    sft_mix: SFTMixConfig = SFTMixConfig()
    """SFT weight schedule (objective `sft_rl_mix`)."""
    critic: CriticConfig = CriticConfig()
    """Value head settings (advantage `gae`)."""

    @field_validator("objective", mode="before")
    @classmethod
    def _objective_name(cls, value: object) -> object:
        return _known_name(value, OBJECTIVE_NAMES, "objective")

    @field_validator("loss_agg", mode="before")
    @classmethod
    def _loss_agg_name(cls, value: object) -> object:
        return _known_name(value, AGGREGATIONS, "loss_agg mode")

    @field_validator("advantage", mode="before")
    @classmethod
    def _advantage(cls, value: object) -> object:
        return parse_variant(value, ADVANTAGE_ESTIMATORS, "advantage estimator")

    @field_validator("policy_loss", mode="before")
    @classmethod
    def _policy_loss(cls, value: object) -> object:
        return parse_variant(value, POLICY_LOSSES, "policy loss")

    @model_validator(mode="after")
    def _check(self) -> AlgorithmConfig:
        if self.loss_agg == "seq-mean-token-sum-norm" and self.loss_agg_horizon is None:
            raise ValueError(
                "loss_agg 'seq-mean-token-sum-norm' needs loss_agg_horizon (e.g. the max response "
                "length in tokens)"
            )
        if self.loss_agg_horizon is not None and self.loss_agg != "seq-mean-token-sum-norm":
            raise ValueError(
                f"loss_agg_horizon is read only by loss_agg 'seq-mean-token-sum-norm' (Dr. GRPO), "
                f"but loss_agg is {self.loss_agg!r}: set loss_agg: seq-mean-token-sum-norm, or "
                "remove loss_agg_horizon"
            )
        return self

    def is_rl(self) -> bool:
        """Whether the objective trains on sampled rollouts with advantages."""
        return self.objective in ("rl", "sft_rl_mix")

    def needs_reference(self) -> bool:
        """Whether the trainer must compute reference-policy log-probs."""
        return self.objective == "dpo" or (self.is_rl() and self.kl is not None)

    def needs_entropy(self) -> bool:
        """Whether the trainer must compute per-token entropy."""
        return self.is_rl() and self.entropy_coef > 0.0

    def needs_critic(self) -> bool:
        """Whether the trainer must run a value head and pass values to the advantages."""
        return self.is_rl() and self.advantage.uses_critic()

    def drops_zero_variance_groups(self) -> bool:
        """Whether the trainer drops groups flagged by `zero_variance_groups` before training."""
        return (
            self.is_rl()
            and self.filter_zero_variance_groups
            and self.advantage.uses_group_baseline()
        )
