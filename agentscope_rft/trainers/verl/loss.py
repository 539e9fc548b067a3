"""Run our policy loss inside verl's engine, micro-batch by micro-batch, with exact batch semantics.

verl's FSDP engine calls `loss_function(model_output, data, dp_group) -> (loss, metrics)` once per
micro-batch and back-propagates each returned loss; FSDP then *averages* gradients over the
data-parallel ranks. Our loss functions compute one batch mean (token-mean, sequence-mean, ...)
over whatever rows they are given, exactly as the torch trainer calls them on a whole batch.

`VerlLoss` bridges the two without touching the loss: for a micro-batch holding `n_micro` of the
step's `n_total` units (trained tokens for token-mean losses, trained sequences for
sequence-mean losses), it returns `loss_fn(micro) * n_micro / n_total * dp_size`. Summed over
micro-batches and averaged over ranks this is `loss_fn(whole batch)` and so are its gradients,
whatever the micro-batch split or rank count. Losses that are plain sums use weight 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorDict

from agentscope_rft.algorithms import AlgorithmConfig, LossInputs, policy_objective

Weighting = Literal["tokens", "sequences", "sum"]
"""How a loss reduces over a batch: mean over trained tokens, mean over trained sequences
(any `seq-mean-*` aggregation), or a plain sum."""

NUM_TOKENS_KEY = "agentscope_rft_num_tokens"
NUM_SEQUENCES_KEY = "agentscope_rft_num_sequences"


@dataclass(frozen=True, slots=True)
class TokenLossInputs:
    """What a policy loss sees: response-aligned [B, R] tensors of one (micro-)batch.

    `logprobs` carries gradients; everything else is data. Column r of row b is the r-th response
    token of sample b; `mask` is 1 on trained tokens and 0 on prompts' tool results and padding.
    """

    logprobs: torch.Tensor  # [B, R] current policy, with grad
    old_logprobs: torch.Tensor  # [B, R] behaviour policy for the ratio
    rollout_logprobs: torch.Tensor  # [B, R] the inference engine's
    advantages: torch.Tensor  # [B, R]
    mask: torch.Tensor  # [B, R] float, 1 on trained tokens
    ref_logprobs: torch.Tensor | None  # [B, R] reference policy, for a KL term


TokenLossFn = Callable[[TokenLossInputs], tuple[torch.Tensor, Mapping[str, float]]]
"""`loss_fn(inputs) -> (scalar loss, metrics)`: the batch mean (or sum) of the policy loss."""

EngineLoss = Callable[[Mapping[str, Any], TensorDict, Any], tuple[torch.Tensor, dict[str, float]]]
"""What verl's engine calls per micro-batch: `(model_output, data, dp_group) -> (loss, metrics)`
(`VerlLoss`, `ObjectiveLoss`)."""


class VerlLoss:
    """A verl engine loss function wrapping one of ours (see module docstring).

    Example:
        >>> def token_mean_pg(x: TokenLossInputs):
        ...     loss = -(x.advantages * x.logprobs * x.mask).sum() / x.mask.sum()
        ...     return loss, {"pg_loss": loss.item()}
        >>> verl_loss = VerlLoss(token_mean_pg, weighting="tokens")
    """

    def __init__(self, loss_fn: TokenLossFn, weighting: Weighting) -> None:
        if weighting not in ("tokens", "sequences", "sum"):
            raise ValueError(f"weighting must be 'tokens', 'sequences' or 'sum', got {weighting!r}")
        self.loss_fn = loss_fn
        self.weighting = weighting

    def __call__(
        self, model_output: Mapping[str, Any], data: TensorDict, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        logprobs = no_padding_2_padding(model_output["log_probs"], data)  # [B, R]
        mask = data["response_mask"].to(logprobs.device, torch.float32)
        dp_size = int(tu.get_non_tensor_data(data, "dp_size", 1))
        weight = self._weight(data, mask)
        if weight == 0.0:  # only padding / all-masked rows: no loss, graph kept for backward
            return (logprobs * 0.0).sum(), {}

        def field(name: str) -> torch.Tensor:
            return data[name].to(logprobs.device, torch.float32)

        inputs = TokenLossInputs(
            logprobs=logprobs,
            old_logprobs=field("old_log_probs"),
            rollout_logprobs=field("rollout_log_probs"),
            advantages=field("advantages"),
            mask=mask,
            ref_logprobs=field("ref_log_prob") if "ref_log_prob" in data else None,
        )
        loss, metrics = self.loss_fn(inputs)
        # Metrics come back as this micro-batch's share of the batch value: summing the shares
        # over micro-batches and ranks gives the metric of the whole batch.
        shares = {name: float(value) * weight for name, value in metrics.items()}
        return loss * weight * dp_size, shares

    def _weight(self, data: TensorDict, mask: torch.Tensor) -> float:
        from verl.utils import tensordict_utils as tu

        if self.weighting == "sum":
            return 1.0 if mask.sum() > 0 else 0.0
        if self.weighting == "tokens":
            total = tu.get_non_tensor_data(data, NUM_TOKENS_KEY, None)
            part = float(mask.sum())
        else:
            total = tu.get_non_tensor_data(data, NUM_SEQUENCES_KEY, None)
            part = float((mask.sum(dim=-1) > 0).sum())
        if total is None:
            raise KeyError(
                f"the batch lacks {NUM_TOKENS_KEY}/{NUM_SEQUENCES_KEY}; build it with "
                "VerlTrainingEngine.train_step"
            )
        return part / float(total)


# Whole-mini-batch values the trainer attaches to a verl batch for `ObjectiveLoss`.
NORM_TOKENS_KEY = "agentscope_rft_norm_tokens"
NORM_SEQUENCES_KEY = "agentscope_rft_norm_sequences"
NORM_SFT_TOKENS_KEY = "agentscope_rft_norm_sft_tokens"
OPTIMIZER_STEP_KEY = "agentscope_rft_optimizer_step"
ROW_FIELDS = ("seq_weights", "sample_kinds", "pair_index", "is_chosen", "gap_rows")
"""[B] per-row fields `ObjectiveLoss` reads (see `VerlTrainer`)."""


class ObjectiveLoss:
    """`policy_objective` of the algorithm library as verl's engine loss: the trainer's one loss.

    The trainer computes the mini-batch normalizers (`loss_normalizers`) and the advantages on
    its side and attaches them to the batch; each micro-batch then returns exactly the share of
    the mini-batch loss that the torch trainer's micro-batch returns, times the data-parallel
    size (FSDP averages gradients over ranks; the shares must add up). Metrics are shares too,
    plus `entropy/sum` and `entropy/tokens` over trained tokens.

    Example:
        >>> loss = ObjectiveLoss(AlgorithmConfig())  # doctest: +SKIP
        >>> worker.set_loss_fn(loss)  # doctest: +SKIP
    """

    def __init__(self, algorithm: AlgorithmConfig) -> None:
        if algorithm.needs_critic() or algorithm.objective == "dpo":
            raise ValueError(f"ObjectiveLoss cannot train objective {algorithm.objective!r} here")
        self.algorithm = algorithm

    def __call__(
        self, model_output: Mapping[str, Any], data: TensorDict, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        algo = self.algorithm
        logprobs = no_padding_2_padding(model_output["log_probs"], data)  # [B, R]
        entropy = None
        if "entropy" in model_output:
            entropy = no_padding_2_padding(model_output["entropy"], data).float()  # [B, R]
        device = logprobs.device

        def field(name: str) -> torch.Tensor:
            return data[name].to(device, torch.float32)

        def meta(name: str) -> float:
            value = tu.get_non_tensor_data(data, name, None)
            if value is None:
                raise KeyError(f"the batch lacks {name}; build it with VerlTrainer")
            return float(value)

        mask = field("response_mask")
        inputs = LossInputs(
            logprobs=logprobs.float(),
            old_logprobs=field("old_log_probs"),
            rollout_logprobs=field("rollout_log_probs"),
            advantages=field("advantages"),
            loss_mask=mask,
            global_num_tokens=meta(NORM_TOKENS_KEY),
            global_num_seqs=meta(NORM_SEQUENCES_KEY),
            global_num_sft_tokens=meta(NORM_SFT_TOKENS_KEY),
            seq_weights=field("seq_weights") if algo.normalize_per_rollout else None,
            ref_logprobs=field("ref_log_prob") if "ref_log_prob" in data else None,
            entropy=entropy if algo.needs_entropy() else None,
            sample_kinds=data["sample_kinds"].to(device),
            pair_index=data["pair_index"].to(device),
            is_chosen=data["is_chosen"].to(device),
        )
        loss, shares = policy_objective(inputs, algo, int(meta(OPTIMIZER_STEP_KEY)))
        trained = mask.bool()
        metrics = dict(shares)
        entropy_sum = entropy.detach()[trained].sum() if entropy is not None else 0.0
        metrics["entropy/sum"] = float(entropy_sum)
        metrics["entropy/tokens"] = float(trained.sum())
        # engine vs trainer log-probs on the tokens of the samples explored by these weights
        # (`LogprobGap`; the trainer keeps the first update's)
        sampled = trained & data["gap_rows"].to(device).bool().unsqueeze(1)
        gap = (logprobs.detach().float() - inputs.rollout_logprobs).abs()[sampled]
        metrics["gap/sum"] = float(gap.sum())
        metrics["gap/tokens"] = float(sampled.sum())
        dp_size = int(tu.get_non_tensor_data(data, "dp_size", 1))
        return loss * dp_size, metrics
