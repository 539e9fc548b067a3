"""Our samples <-> verl's batch layout.

A `Sample` is one flat sequence whose `loss_mask` may hold several 1-spans (assistant turns with
tool results between them). verl's actor batch (the `DataProto` of `verl.trainer.ppo`) splits each
sequence into a left-padded prompt and a right-padded response. Here the prompt is everything
before the first trained token and the response is the rest; `response_mask` is the sample's
`loss_mask` over the response, so tool-result tokens inside the response stay untrained.

Tensors of the padded layout (B samples, P prompt columns, R response columns):

    prompts          [B, P]    int64, left-padded with the pad token
    responses        [B, R]    int64, right-padded
    input_ids        [B, P+R]  prompts ++ responses
    attention_mask   [B, P+R]  1 on real tokens
    position_ids     [B, P+R]  0..len-1 over real tokens (0 on padding)
    response_mask    [B, R]    the sample's loss_mask over the response, 0 on padding
    rollout_log_probs[B, R]    the engine's log-probs (`Sample.logprobs`)
    old_log_probs    [B, R]    behaviour log-probs for the ratio (given, else the rollout's)
    advantages       [B, R]    per-token advantages
    ref_log_prob     [B, R]    reference log-probs (only when given)
    temperature      [B]       float32, the sampling temperature of each sample
    rewards          [B]       float32
    sample_index     [B]       int64, index into the input samples; -1 on padding rows
    uid              [B]       str (NonTensorStack), the task id: the advantage group

`to_engine_layout` turns it into the no-padding (jagged) layout verl's FSDP engine consumes with
verl's own `left_right_2_no_padding`; `response_values_to_tokens` maps a [B, R] result back onto
each sample's token positions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDict

from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

PAD_UID_PREFIX = "__pad__"
PadPolicy = Literal["pad", "trim"]

# [B, R] fields that come from per-token values of the samples.
RESPONSE_FLOAT_FIELDS = ("rollout_log_probs", "old_log_probs", "advantages", "ref_log_prob")


@dataclass(frozen=True, slots=True)
class UnpackedSample:
    """One row of a batch mapped back onto its sample's tokens (inverse of `build_batch`)."""

    sample_index: int
    uid: str
    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    old_logprobs: list[float]
    advantages: list[float]
    temperature: float
    reward: float


def prompt_length(sample: Sample) -> int:
    """Tokens before the first trained token (all but the last when nothing is trained).

    Raises:
        ValueError: the sample has fewer than 2 tokens or trains its first token (which has
            no context to be predicted from).
    """
    n = len(sample.token_ids)
    name = sample.sample_id or sample.rollout_id
    if n < 2:
        raise ValueError(f"sample {name}: needs at least 2 tokens to train on, has {n}")
    first = next((i for i, m in enumerate(sample.loss_mask) if m), None)
    if first == 0:
        raise ValueError(
            f"sample {name}: loss_mask[0] is 1, but the first token has no context to be "
            "predicted from; mask it (it belongs to the prompt)"
        )
    return n - 1 if first is None else first


def _per_token_rows(
    values: torch.Tensor | Sequence[Sequence[float]] | None, samples: Sequence[Sample], name: str
) -> list[torch.Tensor] | None:
    """Per-sample float32 rows of length len(token_ids) from [N, T], [N] or a list of lists."""
    if values is None:
        return None
    rows: list[torch.Tensor] = []
    if isinstance(values, torch.Tensor):
        if values.shape[0] != len(samples) or values.dim() not in (1, 2):
            raise ValueError(
                f"{name}: expected shape [N] or [N, T] with N={len(samples)}, "
                f"got {tuple(values.shape)}"
            )
        values = values.detach().to("cpu", torch.float32)
        for i, sample in enumerate(samples):
            n = len(sample.token_ids)
            if values.dim() == 1:  # one value per sample, on its trained tokens
                mask = torch.tensor(list(sample.loss_mask), dtype=torch.float32)
                rows.append(values[i] * mask)
            elif values.shape[1] < n:
                raise ValueError(f"{name}: row {i} has {values.shape[1]} columns for {n} tokens")
            else:
                rows.append(values[i, :n])
        return rows
    if len(values) != len(samples):
        raise ValueError(f"{name}: {len(values)} rows for {len(samples)} samples")
    for i, (row, sample) in enumerate(zip(values, samples, strict=True)):
        if len(row) != len(sample.token_ids):
            raise ValueError(f"{name}: row {i} has {len(row)} values for {len(sample.token_ids)}")
        rows.append(torch.tensor(list(row), dtype=torch.float32))
    return rows


def padding_needed(num_samples: int, multiple: int, policy: PadPolicy) -> int:
    """Rows to add (> 0) or drop (< 0) so that `num_samples` divides by `multiple`."""
    remainder = num_samples % multiple
    if remainder == 0:
        return 0
    if policy == "trim":
        if num_samples - remainder == 0:
            raise ValueError(
                f"cannot trim a batch of {num_samples} samples to a multiple of {multiple}: "
                "nothing would be left; use batch_padding 'pad' or a larger batch"
            )
        return -remainder
    return multiple - remainder


def build_batch(
    samples: Sequence[Sample],
    advantages: torch.Tensor | Sequence[Sequence[float]],
    *,
    pad_token_id: int,
    old_logprobs: torch.Tensor | Sequence[Sequence[float]] | None = None,
    ref_logprobs: torch.Tensor | Sequence[Sequence[float]] | None = None,
    multiple_of: int = 1,
    pad_policy: PadPolicy = "pad",
) -> TensorDict:
    """Build verl's padded prompt/response batch from our samples.

    Args:
        samples: the batch, in order.
        advantages: per-token [N, T] (column t belongs to token t), per-sample [N] (spread over
            each sample's trained tokens), or one list per sample.
        pad_token_id: the token id used for padding (never trained, never attended).
        old_logprobs: behaviour log-probs for the importance ratio, same shapes as advantages;
            default: the rollout log-probs in `Sample.logprobs`.
        ref_logprobs: reference-policy log-probs for a KL term, same shapes; omitted if None.
        multiple_of: the row count must divide by this (data-parallel ranks x micro-batch).
        pad_policy: "pad" adds fully-masked 2-token rows (they add no loss and no gradient);
            "trim" drops trailing samples. Either way one log line says so.

    Returns:
        A TensorDict with batch size [rows], fields as in the module docstring.

    Raises:
        ValueError: empty batch, nothing to train, or a malformed sample.

    Example:
        >>> s = Sample(token_ids=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.1],
        ...            reward=1.0, rollout_id="r1", task_id="t1")
        >>> td = build_batch([s], torch.tensor([[0.0, 1.0, 1.0]]), pad_token_id=2)
        >>> td["responses"].tolist(), td["response_mask"].tolist()
        ([[6, 7]], [[1, 1]])
    """
    if not samples:
        raise ValueError("cannot build a training batch from 0 samples")
    if sum(s.num_trained_tokens for s in samples) == 0:
        raise ValueError(
            f"all {len(samples)} samples have loss_mask 0 everywhere: nothing to train on "
            "(check the trajectory builder's merge report)"
        )
    adv_rows = _per_token_rows(advantages, samples, "advantages")
    old_rows = _per_token_rows(old_logprobs, samples, "old_logprobs")
    ref_rows = _per_token_rows(ref_logprobs, samples, "ref_logprobs")
    assert adv_rows is not None

    change = padding_needed(len(samples), multiple_of, pad_policy)
    keep = len(samples) + min(change, 0)
    if change:
        verb = "padded with" if change > 0 else "trimmed by"
        what = "fully-masked samples" if change > 0 else "samples (dropped from the end)"
        logger.info(
            "verl: batch of %d samples %s %d %s to %d, a multiple of %d (data-parallel ranks x "
            "micro-batch size)",
            len(samples),
            verb,
            abs(change),
            what,
            len(samples) + change,
            multiple_of,
        )

    prompt_lens = [prompt_length(s) for s in samples[:keep]]
    response_lens = [len(s.token_ids) - p for s, p in zip(samples, prompt_lens, strict=False)]
    num_pad = max(change, 0)
    max_prompt = max([*prompt_lens, 1])
    max_response = max([*response_lens, 1])
    rows = keep + num_pad

    prompts = torch.full((rows, max_prompt), pad_token_id, dtype=torch.int64)
    responses = torch.full((rows, max_response), pad_token_id, dtype=torch.int64)
    attention = torch.zeros((rows, max_prompt + max_response), dtype=torch.int64)
    response_mask = torch.zeros((rows, max_response), dtype=torch.int64)
    floats = {name: torch.zeros((rows, max_response)) for name in RESPONSE_FLOAT_FIELDS}
    temperature = torch.ones(rows)
    rewards = torch.zeros(rows)
    sample_index = torch.full((rows,), -1, dtype=torch.int64)
    uids: list[str] = []

    for i, sample in enumerate(samples[:keep]):
        p, r = prompt_lens[i], response_lens[i]
        ids = torch.tensor(list(sample.token_ids), dtype=torch.int64)
        prompts[i, max_prompt - p :] = ids[:p]
        responses[i, :r] = ids[p:]
        attention[i, max_prompt - p : max_prompt + r] = 1
        response_mask[i, :r] = torch.tensor(list(sample.loss_mask[p:]), dtype=torch.int64)
        rollout = torch.tensor(list(sample.logprobs), dtype=torch.float32)
        floats["rollout_log_probs"][i, :r] = rollout[p:]
        floats["old_log_probs"][i, :r] = (old_rows[i] if old_rows else rollout)[p:]
        floats["advantages"][i, :r] = adv_rows[i][p:]
        if ref_rows is not None:
            floats["ref_log_prob"][i, :r] = ref_rows[i][p:]
        temperature[i] = sample.temperature
        rewards[i] = sample.reward
        sample_index[i] = i
        uids.append(sample.task_id)
    for j in range(num_pad):  # one masked prompt token + one masked response token
        i = keep + j
        attention[i, max_prompt - 1 : max_prompt + 1] = 1
        uids.append(f"{PAD_UID_PREFIX}{j}")

    position_ids = (attention.cumsum(dim=-1) - 1).clamp(min=0) * attention
    fields: dict[str, torch.Tensor | list[str]] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "temperature": temperature,
        "rewards": rewards,
        "sample_index": sample_index,
        "uid": uids,
    }
    fields.update({k: v for k, v in floats.items() if k != "ref_log_prob" or ref_rows is not None})
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict(fields)


def num_trained_sequences(batch: TensorDict) -> int:
    """Rows with at least one trained token (padding rows and all-masked samples excluded)."""
    return int((batch["response_mask"].sum(dim=-1) > 0).sum().item())


def shard(batch: TensorDict, rank: int, world_size: int) -> TensorDict:
    """The contiguous slice of a padded batch that data-parallel `rank` trains on."""
    rows = batch.batch_size[0]
    if rows % world_size:
        raise ValueError(
            f"a batch of {rows} rows does not split across {world_size} data-parallel ranks; "
            "build it with multiple_of=dp_size*micro_batch_size"
        )
    size = rows // world_size
    return batch[rank * size : (rank + 1) * size]


def to_engine_layout(batch: TensorDict) -> TensorDict:
    """verl's no-padding layout: jagged `input_ids`/`position_ids`, `loss_mask` = response_mask.

    Uses `verl.workers.utils.padding.left_right_2_no_padding` (the conversion verl's own PPO
    trainer applies before `update_actor`) on a copy; the padded fields it keeps (prompts,
    responses, attention_mask and the [B, R] fields) are what the loss reads back.
    """
    from verl.workers.utils.padding import left_right_2_no_padding

    return left_right_2_no_padding(batch.clone())


def response_values_to_tokens(values: torch.Tensor, batch: TensorDict) -> list[list[float]]:
    """Map [B, R] per-response-token values back to each real sample's token positions.

    Prompt positions get 0.0. Padding rows are dropped; rows come back in `sample_index` order.
    """
    lists = _response_rows(values, batch)
    return [row for _, row in sorted(lists.items())]


def _response_rows(values: torch.Tensor, batch: TensorDict) -> dict[int, list[float]]:
    prompt_lens = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(dim=-1).tolist()
    response_lens = batch["attention_mask"][:, batch["prompts"].shape[1] :].sum(dim=-1).tolist()
    out: dict[int, list[float]] = {}
    values = values.detach().to("cpu", torch.float32)
    for i, index in enumerate(batch["sample_index"].tolist()):
        if index < 0:
            continue
        p, r = int(prompt_lens[i]), int(response_lens[i])
        out[index] = [0.0] * p + values[i, :r].tolist()
    return out


def unpack_batch(batch: TensorDict) -> list[UnpackedSample]:
    """Inverse of `build_batch` for the real rows, in `sample_index` order (exact round trip)."""
    width = batch["prompts"].shape[1]
    attention = batch["attention_mask"]
    per_token = {
        name: _response_rows(batch[name], batch)
        for name in ("rollout_log_probs", "old_log_probs", "advantages")
    }
    uids = _uids(batch)
    out: list[UnpackedSample] = []
    for i, index in enumerate(batch["sample_index"].tolist()):
        if index < 0:
            continue
        p = int(attention[i, :width].sum())
        r = int(attention[i, width:].sum())
        token_ids = batch["prompts"][i, width - p :].tolist() + batch["responses"][i, :r].tolist()
        mask = [0] * p + batch["response_mask"][i, :r].tolist()
        out.append(
            UnpackedSample(
                sample_index=index,
                uid=uids[i],
                token_ids=token_ids,
                loss_mask=mask,
                rollout_logprobs=per_token["rollout_log_probs"][index],
                old_logprobs=per_token["old_log_probs"][index],
                advantages=per_token["advantages"][index],
                temperature=float(batch["temperature"][i]),
                reward=float(batch["rewards"][i]),
            )
        )
    return sorted(out, key=lambda u: u.sample_index)


def _uids(batch: TensorDict) -> list[str]:
    from verl.utils import tensordict_utils as tu

    uids = tu.get(batch, "uid")
    return [str(u) for u in (uids.tolist() if hasattr(uids, "tolist") else uids)]


def sequence_lengths(batch: TensorDict) -> list[int]:
    """Real tokens per row (what verl's MFU estimate counts)."""
    return [int(n) for n in batch["attention_mask"].sum(dim=-1).tolist()]
