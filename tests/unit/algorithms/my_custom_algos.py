"""Custom algorithms referenced by import path in the config tests (`my_custom_algos:...`)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from agentscope_rft.algorithms import AdvantageInputs, AdvantageOutputs, LossInputs


class ScaledRewardArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float = Field(default=1.0, gt=0.0)
    """Multiplies each episode's reward."""


def scaled_reward(inputs: AdvantageInputs, cfg: ScaledRewardArgs) -> AdvantageOutputs:
    """Advantage = scale * reward on every trained token (no baseline)."""
    advantages = cfg.scale * inputs.rewards.unsqueeze(-1) * inputs.loss_mask
    return AdvantageOutputs(
        advantages=advantages, returns=None, metrics={"custom/scale": cfg.scale}
    )


class ReinforceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    coef: float = 1.0


def vanilla_reinforce(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    """On-policy REINFORCE: -coef * A * log pi."""
    loss = -cfg.coef * inputs.advantages * inputs.logprobs
    return loss, {"logprob": inputs.logprobs.detach()}


def one_parameter(inputs: AdvantageInputs) -> AdvantageOutputs:
    raise NotImplementedError


def unannotated_cfg(inputs: AdvantageInputs, cfg) -> AdvantageOutputs:  # type: ignore[no-untyped-def]
    raise NotImplementedError


def wrong_inputs(inputs: LossInputs, cfg: ScaledRewardArgs) -> AdvantageOutputs:
    raise NotImplementedError


def wrong_return(inputs: AdvantageInputs, cfg: ScaledRewardArgs) -> Tensor:
    raise NotImplementedError


def returns_tensor(inputs: AdvantageInputs, cfg: ScaledRewardArgs):  # type: ignore[no-untyped-def]
    return torch.zeros_like(inputs.loss_mask, dtype=torch.float32)


NOT_CALLABLE = 3


def nan_advantages(inputs: AdvantageInputs, cfg: ScaledRewardArgs) -> AdvantageOutputs:
    """A group std of 0 divided into: NaN on every token."""
    centered = inputs.rewards - inputs.rewards.mean()
    advantages = (centered / centered.std(correction=0)).unsqueeze(-1) * inputs.loss_mask
    return AdvantageOutputs(advantages=advantages, returns=None, metrics={})


def list_advantages(inputs: AdvantageInputs, cfg: ScaledRewardArgs) -> AdvantageOutputs:
    return AdvantageOutputs(advantages=inputs.loss_mask.tolist(), returns=None, metrics={})  # type: ignore[arg-type]


def integer_advantages(inputs: AdvantageInputs, cfg: ScaledRewardArgs) -> AdvantageOutputs:
    """+1 / -1 per token, as a long tensor."""
    sign = (inputs.rewards > 0).long() * 2 - 1
    return AdvantageOutputs(
        advantages=sign.unsqueeze(-1) * inputs.loss_mask.long(), returns=None, metrics={}
    )


def nan_loss(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    return inputs.logprobs * torch.log(torch.zeros_like(inputs.advantages)) * 0.0, {}


def constant_loss(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    """Built from constants only: no gradient reaches the policy."""
    return -inputs.advantages * inputs.old_logprobs, {}


def scalar_metric(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    return -inputs.advantages * inputs.logprobs, {"logprob": inputs.logprobs.mean()}


def raising_loss(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    raise KeyError("advantage_scale")


async def async_loss(inputs: LossInputs, cfg: ReinforceArgs) -> tuple[Tensor, dict[str, Tensor]]:
    return -inputs.advantages * inputs.logprobs, {}
