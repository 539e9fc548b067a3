"""The algorithm library: advantage estimators, policy losses, KL, SFT/DPO, as pure functions.

The trainer calls `compute_advantages` once per batch and `policy_objective` once per micro-batch
(plus `value_loss` with a critic); `AlgorithmConfig` is the `algorithm:` section of the run config.
See docs/algorithms.md for the table of algorithms, their keys and papers.
"""

from agentscope_rft.algorithms.advantages import (
    GAEConfig,
    GRPOConfig,
    ReinforcePlusPlusBaselineConfig,
    ReinforcePlusPlusConfig,
    RLOOConfig,
    StepwiseConfig,
    zero_variance_groups,
)
from agentscope_rft.algorithms.aggregation import AGGREGATIONS, Normalizers, aggregate
from agentscope_rft.algorithms.base import (
    SAMPLE_KIND_CODES,
    AdvantageInputs,
    AdvantageOutputs,
    LossInputs,
    encode_sample_kinds,
    rollout_seq_weights,
)
from agentscope_rft.algorithms.config import AlgorithmConfig, CriticConfig, KLConfig
from agentscope_rft.algorithms.custom import CustomAdvantageConfig, CustomPolicyLossConfig
from agentscope_rft.algorithms.gigpo import GiGPOConfig
from agentscope_rft.algorithms.kl import KL_ESTIMATORS, apply_kl_penalty, kl_estimate
from agentscope_rft.algorithms.losses import (
    CISPOConfig,
    GSPOConfig,
    PPOClipConfig,
    TISConfig,
    tis_weights,
)
from agentscope_rft.algorithms.objective import (
    OBJECTIVES,
    LossNormalizers,
    compute_advantages,
    loss_normalizers,
    policy_objective,
    value_loss,
)
from agentscope_rft.algorithms.offline import DPOConfig, SFTMixConfig, sft_mix_weight
from agentscope_rft.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "POLICY_LOSSES",
    "SAMPLE_KIND_CODES",
    "AdvantageInputs",
    "AdvantageOutputs",
    "AlgorithmConfig",
    "CISPOConfig",
    "CriticConfig",
    "CustomAdvantageConfig",
    "CustomPolicyLossConfig",
    "DPOConfig",
    "GAEConfig",
    "GRPOConfig",
    "GSPOConfig",
    "GiGPOConfig",
    "KLConfig",
    "LossInputs",
    "LossNormalizers",
    "Normalizers",
    "PPOClipConfig",
    "RLOOConfig",
    "ReinforcePlusPlusBaselineConfig",
    "ReinforcePlusPlusConfig",
    "SFTMixConfig",
    "StepwiseConfig",
    "TISConfig",
    "aggregate",
    "apply_kl_penalty",
    "compute_advantages",
    "encode_sample_kinds",
    "kl_estimate",
    "loss_normalizers",
    "policy_objective",
    "rollout_seq_weights",
    "sft_mix_weight",
    "tis_weights",
    "value_loss",
    "zero_variance_groups",
]
