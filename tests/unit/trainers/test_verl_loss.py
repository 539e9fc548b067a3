"""VerlLoss: any micro-batch split and rank count reproduces the whole-batch loss and gradient."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

from verl.utils import tensordict_utils as tu

from agentscope_rft.trainers.verl.convert import (
    build_batch,
    num_trained_sequences,
    to_engine_layout,
)
from agentscope_rft.trainers.verl.loss import (
    NUM_SEQUENCES_KEY,
    NUM_TOKENS_KEY,
    TokenLossInputs,
    VerlLoss,
)
from agentscope_rft.types import Sample


def _token_mean(x: TokenLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    loss = -(x.advantages * x.logprobs * x.mask).sum() / x.mask.sum()
    return loss, {"pg": float(loss.detach())}


def _seq_mean_token_mean(x: TokenLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    per_seq = (x.advantages * x.logprobs * x.mask).sum(-1) / x.mask.sum(-1).clamp(min=1)
    trained = (x.mask.sum(-1) > 0).float()
    loss = -(per_seq * trained).sum() / trained.sum()
    return loss, {"pg": float(loss.detach())}


def _token_sum(x: TokenLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    loss = -(x.advantages * x.logprobs * x.mask).sum()
    return loss, {"pg": float(loss.detach())}


def _batch():
    gen = torch.Generator().manual_seed(1)
    samples = []
    for i, (n, p) in enumerate([(5, 2), (9, 3), (4, 1), (7, 6), (6, 2), (8, 4), (3, 3), (6, 1)]):
        mask = [0] * p + [1] * (n - p)
        if n - p > 2:
            mask[p + 1] = 0
        ids = torch.randint(3, 100, (n,), generator=gen).tolist()
        samples.append(Sample(ids, mask, [0.0] * n, 0.0, f"r{i}", f"t{i // 2}"))
    advantages = torch.randn(len(samples), 9, generator=gen)
    batch = build_batch(samples, advantages, pad_token_id=0)
    lengths = batch["attention_mask"].sum(-1)
    theta = torch.randn(int(lengths.sum()), generator=gen)  # a "log-prob" per packed token
    return batch, theta, lengths


def _loss_on_rows(verl_loss, batch, theta, lengths, rows, dp_size):
    """What verl's engine computes on one micro-batch: nested log-probs in, loss out."""
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    micro = to_engine_layout(batch[rows[0] : rows[-1] + 1])
    pieces = [theta[starts[r] : starts[r + 1]] for r in rows]
    log_probs = torch.nested.nested_tensor_from_jagged(
        torch.cat(pieces),
        offsets=torch.tensor([0, *torch.tensor([len(p) for p in pieces]).cumsum(0)]),
    )
    tu.assign_non_tensor(
        micro,
        dp_size=dp_size,
        **{
            NUM_TOKENS_KEY: int(batch["response_mask"].sum()),
            NUM_SEQUENCES_KEY: num_trained_sequences(batch),
        },
    )
    return verl_loss({"log_probs": log_probs}, micro)


@pytest.mark.parametrize(
    ("loss_fn", "weighting"),
    [(_token_mean, "tokens"), (_seq_mean_token_mean, "sequences"), (_token_sum, "sum")],
)
@pytest.mark.parametrize(
    ("dp_size", "splits"),
    [(1, [[0, 1, 2, 3, 4, 5, 6, 7]]), (1, [[0, 1, 2], [3], [4, 5, 6, 7]]), (2, [[0, 1], [2, 3]])],
)
def test_split_matches_whole_batch(loss_fn, weighting, dp_size, splits) -> None:
    batch, theta, lengths = _batch()
    verl_loss = VerlLoss(loss_fn, weighting=weighting)

    whole = theta.clone().requires_grad_(True)
    want, want_metrics = _loss_on_rows(
        VerlLoss(loss_fn, weighting), batch, whole, lengths, list(range(8)), 1
    )
    want.backward()

    # dp ranks own contiguous halves; each rank runs `splits` as its micro-batches (row offsets)
    per_rank = len(batch) // dp_size
    grads, total, metric = [], 0.0, 0.0
    for rank in range(dp_size):
        leaf = theta.clone().requires_grad_(True)
        for split in splits:
            rows = [rank * per_rank + r for r in split]
            loss, metrics = _loss_on_rows(verl_loss, batch, leaf, lengths, rows, dp_size)
            loss.backward()
            total += float(loss.detach()) / dp_size  # verl averages the reported loss over ranks
            metric += metrics.get("pg", 0.0)
        grads.append(leaf.grad)
    averaged = torch.stack(grads).mean(0)  # what FSDP's gradient reduction does
    assert total == pytest.approx(float(want.detach()), rel=1e-6)
    assert metric == pytest.approx(want_metrics["pg"], rel=1e-6)
    torch.testing.assert_close(averaged, whole.grad, rtol=1e-6, atol=1e-7)


def test_fully_masked_micro_batch_gives_zero_loss_with_graph() -> None:
    samples = [
        Sample([5, 6, 7], [0, 1, 1], [0.0, -1.0, -1.0], 1.0, "r0", "t"),
        Sample([5, 6, 7], [0, 0, 0], [0.0] * 3, 0.0, "r1", "t"),
    ]
    batch = build_batch(samples, torch.ones(2), pad_token_id=0)
    theta = torch.randn(6, requires_grad=True)
    loss, metrics = _loss_on_rows(
        VerlLoss(_token_mean, "tokens"), batch, theta, batch["attention_mask"].sum(-1), [1], 1
    )
    loss.backward()
    assert float(loss.detach()) == 0.0 and metrics == {}
    assert torch.equal(theta.grad, torch.zeros(6))


def test_unknown_weighting_is_rejected() -> None:
    with pytest.raises(ValueError, match="weighting"):
        VerlLoss(_token_mean, weighting="mean")  # type: ignore[arg-type]
