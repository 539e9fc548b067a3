"""The explicit name -> (function, config class) tables of advantage estimators and policy losses.

Adding an algorithm is one function, one config class (its `type` is the name) and one line here.
A user's own function needs no line: `type: custom` with `path: "pkg.mod:fn"`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from torch import Tensor

from agentscope_rft.algorithms import advantages as adv
from agentscope_rft.algorithms import gigpo, losses
from agentscope_rft.algorithms.base import AdvantageInputs, AdvantageOutputs, LossInputs
from agentscope_rft.algorithms.custom import (
    CustomAdvantageConfig,
    CustomPolicyLossConfig,
    custom_advantages,
    custom_policy_loss,
)
from agentscope_rft.algorithms.spec import (
    AdvantageConfigBase,
    PolicyLossConfigBase,
    unknown_name_message,
)

FnT = TypeVar("FnT")
ConfigT = TypeVar("ConfigT", bound=BaseModel)


@dataclass(frozen=True)
class Entry(Generic[FnT, ConfigT]):
    """One algorithm: its function and the config class its `cfg` parameter takes."""

    fn: FnT
    config: type[ConfigT]


# The second argument is typed Any because each function takes its own config class; a test checks
# that every function's `cfg` annotation is the config class it is paired with.
AdvantageFn = Callable[[AdvantageInputs, Any], AdvantageOutputs]
PolicyLossFn = Callable[[LossInputs, Any], tuple[Tensor, dict[str, Tensor]]]

ADVANTAGE_ESTIMATORS: dict[str, Entry[AdvantageFn, AdvantageConfigBase]] = {
    "grpo": Entry(adv.grpo_advantages, adv.GRPOConfig),
    "rloo": Entry(adv.rloo_advantages, adv.RLOOConfig),
    "reinforce_plus_plus": Entry(adv.reinforce_plus_plus_advantages, adv.ReinforcePlusPlusConfig),
    "reinforce_plus_plus_baseline": Entry(
        adv.reinforce_plus_plus_baseline_advantages, adv.ReinforcePlusPlusBaselineConfig
    ),
    "gae": Entry(adv.gae_advantages, adv.GAEConfig),
    "stepwise": Entry(adv.stepwise_advantages, adv.StepwiseConfig),
    "gigpo": Entry(gigpo.gigpo_advantages, gigpo.GiGPOConfig),
    "custom": Entry(custom_advantages, CustomAdvantageConfig),
}

POLICY_LOSSES: dict[str, Entry[PolicyLossFn, PolicyLossConfigBase]] = {
    "ppo": Entry(losses.ppo_clip_loss, losses.PPOClipConfig),
    "gspo": Entry(losses.gspo_loss, losses.GSPOConfig),
    "cispo": Entry(losses.cispo_loss, losses.CISPOConfig),
    "custom": Entry(custom_policy_loss, CustomPolicyLossConfig),
}

ConfigBaseT = TypeVar("ConfigBaseT", bound=BaseModel)


def parse_variant(
    value: object, table: Mapping[str, Entry[Any, ConfigBaseT]], kind: str
) -> ConfigBaseT | object:
    """Validate a `type`-keyed variant: a bare name, a `{type: name, ...}` dict, or a config.

    Unknown names fail with a did-you-mean message that lists the known ones. Anything else is
    returned unchanged for pydantic to reject with its own message.

    Example:
        >>> parse_variant("rloo", ADVANTAGE_ESTIMATORS, "advantage estimator")
        RLOOConfig(type='rloo')
    """
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, dict):
        return value
    name = value.get("type")
    if name is None:
        raise ValueError(f"{kind} needs a `type`; known: {', '.join(sorted(table))}")
    entry = table.get(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(unknown_name_message(kind, name, table))
    return entry.config.model_validate(value)
