"""Every algorithm and objective trains a few optimizer steps of the tiny model end to end.

A small stand-in for the trainer: forward the tiny LM, gather per-token log-probs (and entropy,
and values from a linear head for PPO), compute advantages, split the mini-batch into two
micro-batches, accumulate `policy_objective` (+ `value_loss`) gradients, step. Asserts finite
losses and changed weights. SFT and DPO read the small files in tests/data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agentscope_rft.algorithms import (
    AdvantageInputs,
    AlgorithmConfig,
    LossInputs,
    apply_kl_penalty,
    compute_advantages,
    encode_sample_kinds,
    kl_estimate,
    loss_normalizers,
    policy_objective,
    rollout_seq_weights,
    value_loss,
    zero_variance_groups,
)
from agentscope_rft.buffer.offline import load_dpo_samples, load_sft_samples
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.types import Sample

DATA = Path(__file__).resolve().parents[2] / "data"


@dataclasses.dataclass
class Tiny:
    model: nn.Module
    value_head: nn.Linear
    renderer: ChatRenderer
    initial: dict[str, Tensor]
    pad_id: int


@pytest.fixture(scope="module")
def tiny() -> Iterator[Tiny]:
    from agentscope_rft.models import load_causal_lm, load_tokenizer, resolve_model

    path = resolve_model("tiny-random")
    torch.manual_seed(0)
    model = load_causal_lm(path).train()
    tokenizer = load_tokenizer(path)
    head = nn.Linear(model.config.hidden_size, 1)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    yield Tiny(model, head, ChatRenderer(tokenizer), initial, int(tokenizer.pad_token_id))


@pytest.fixture()
def fresh(tiny: Tiny) -> Tiny:
    tiny.model.load_state_dict(tiny.initial)
    torch.manual_seed(0)
    tiny.value_head.reset_parameters()
    return tiny


def _forward(tiny: Tiny, ids: Tensor, entropy: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token log-probs, entropy (zeros unless asked) and values [B, T], aligned with `ids`
    (position t scores token t given the tokens before it; position 0 is 0)."""
    out = tiny.model(input_ids=ids, output_hidden_states=True)
    logp_all = F.log_softmax(out.logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    logprobs = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else torch.zeros_like(logprobs)
    values = tiny.value_head(out.hidden_states[-1][:, :-1]).squeeze(-1)  # [B, T-1]
    pad = logprobs.new_zeros(ids.shape[0], 1)
    return torch.cat([pad, logprobs], 1), torch.cat([pad, ent], 1), torch.cat([pad, values], 1)


def _changed(tiny: Tiny) -> bool:
    state = tiny.model.state_dict()
    return any(not torch.equal(state[k], v) for k, v in tiny.initial.items())


@dataclasses.dataclass
class Batch:
    ids: Tensor  # [N, T]
    mask: Tensor  # [N, T]
    rewards: Tensor  # [N]
    group_ids: Tensor  # [N]
    episode_ids: Tensor  # [N]
    token_rewards: Tensor  # [N, T]
    kinds: Tensor  # [N]
    pair_index: Tensor  # [N]


def _rl_batch() -> Batch:
    # Five samples: episode 0 is split into two samples (two calls); groups of 3 and 2 episodes.
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 2000, (6, 16), generator=gen)
    mask = torch.zeros(6, 16, dtype=torch.long)
    mask[:, 6:14] = 1
    mask[1, 9:11] = 0  # a tool result inside a merged multi-call sample
    mask[0, 10:] = 0  # episode 0, first call ...
    mask[2, :12] = 0  # ... and its second call
    token_rewards = torch.zeros(6, 16)
    token_rewards[0, 9] = 0.3  # a per-step reward on the last token of a call
    return Batch(
        ids=ids,
        mask=mask,
        rewards=torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 1.0]),
        group_ids=torch.tensor([0, 0, 0, 0, 1, 1]),
        episode_ids=torch.tensor([0, 1, 0, 2, 3, 4]),
        token_rewards=token_rewards,
        kinds=encode_sample_kinds(["rl"] * 6),
        pair_index=torch.zeros(6, dtype=torch.long),
    )


def _pad(samples: list[Sample], pad_id: int) -> tuple[Tensor, Tensor]:
    length = max(len(s.token_ids) for s in samples)
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s.token_ids)] = torch.tensor(list(s.token_ids))
        mask[i, : len(s.token_ids)] = torch.tensor(list(s.loss_mask))
    return ids, mask


def _offline_batch(samples: list[Sample], pad_id: int) -> Batch:
    ids, mask = _pad(samples, pad_id)
    pair_names = {s.pair_id for s in samples}
    pair_index = {name: i for i, name in enumerate(sorted(str(p) for p in pair_names))}
    n = len(samples)
    return Batch(
        ids=ids,
        mask=mask,
        rewards=torch.zeros(n),
        group_ids=torch.arange(n),
        episode_ids=torch.arange(n),
        token_rewards=torch.zeros(ids.shape),
        kinds=encode_sample_kinds([s.kind for s in samples]),
        pair_index=torch.tensor([pair_index[str(s.pair_id)] for s in samples]),
    )


def _train(
    tiny: Tiny, batch: Batch, cfg: AlgorithmConfig, steps: int = 2, split: int | None = None
) -> list[float]:
    """Optimizer steps over `batch` as two micro-batches, split before row `split`."""
    params = list(tiny.model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": params}, {"params": tiny.value_head.parameters(), "lr": 1e-2}], lr=1e-3
    )
    with torch.no_grad():
        old_logprobs, _, old_values = _forward(tiny, batch.ids)
    ref_logprobs = old_logprobs.clone()
    # The engine's log-probs differ slightly from the trainer's (what TIS corrects).
    rollout_logprobs = old_logprobs + 0.01 * torch.randn(old_logprobs.shape)
    losses = []
    for step in range(steps):
        if step > 0:  # the proximal policy: the weights before this step's update
            with torch.no_grad():
                old_logprobs, _, _ = _forward(tiny, batch.ids)
        token_rewards = batch.token_rewards
        if cfg.kl is not None and cfg.kl.apply_to == "reward":
            kl = kl_estimate(old_logprobs, ref_logprobs, cfg.kl.estimator)
            token_rewards = apply_kl_penalty(token_rewards, kl, batch.mask, cfg.kl.coef)
        advantages = torch.zeros(batch.mask.shape)
        returns = None
        rl_rows = batch.kinds == 0
        if cfg.is_rl():
            if cfg.drops_zero_variance_groups():
                assert not zero_variance_groups(
                    batch.rewards[rl_rows], batch.group_ids[rl_rows]
                ).any()
            out = compute_advantages(
                AdvantageInputs(
                    rewards=batch.rewards[rl_rows],
                    group_ids=batch.group_ids[rl_rows],
                    episode_ids=batch.episode_ids[rl_rows],
                    loss_mask=batch.mask[rl_rows],
                    token_rewards=token_rewards[rl_rows],
                    values=old_values[rl_rows] if cfg.needs_critic() else None,
                ),
                cfg,
            )
            advantages[rl_rows] = out.advantages
            returns = out.returns
        seq_weights = rollout_seq_weights(batch.episode_ids)
        norms = loss_normalizers(batch.mask, cfg, seq_weights, batch.kinds)
        split = split or batch.ids.shape[0] // 2
        total = 0.0
        for rows in (slice(0, split), slice(split, None)):
            logprobs, entropy, values = _forward(tiny, batch.ids[rows], cfg.needs_entropy())
            inputs = LossInputs(
                logprobs=logprobs,
                old_logprobs=old_logprobs[rows],
                rollout_logprobs=rollout_logprobs[rows],
                advantages=advantages[rows],
                loss_mask=batch.mask[rows],
                global_num_tokens=norms.num_tokens,
                global_num_seqs=norms.num_seqs,
                seq_weights=seq_weights[rows],
                ref_logprobs=ref_logprobs[rows] if cfg.needs_reference() else None,
                entropy=entropy if cfg.needs_entropy() else None,
                sample_kinds=batch.kinds[rows],
                pair_index=batch.pair_index[rows],
                global_num_sft_tokens=norms.num_sft_tokens,
            )
            loss, metrics = policy_objective(inputs, cfg, step)
            if cfg.needs_critic():
                assert returns is not None
                critic_loss, critic_metrics = value_loss(
                    values,
                    old_values[rows],
                    returns[rows],
                    batch.mask[rows],
                    cfg,
                    norms.num_tokens,
                )
                loss = loss + critic_loss
                metrics.update(critic_metrics)
            loss.backward()
            total += float(loss.detach())
            assert all(math.isfinite(v) for v in metrics.values()), metrics
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


RL_ALGORITHMS = {
    "grpo": {"advantage": "grpo"},
    "dr_grpo": {
        "advantage": {"type": "grpo", "normalize_std": False},
        "loss_agg": "seq-mean-token-sum-norm",
        "loss_agg_horizon": 16,
    },
    "dapo_style": {"policy_loss": {"type": "ppo", "clip_high": 0.28}, "entropy_coef": 0.01},
    "rloo": {"advantage": "rloo"},
    "reinforce_plus_plus": {"advantage": {"type": "reinforce_plus_plus", "gamma": 0.99}},
    "reinforce_plus_plus_baseline": {"advantage": "reinforce_plus_plus_baseline"},
    "stepwise": {"advantage": {"type": "stepwise", "gamma": 0.9}},
    "ppo_gae_critic": {"advantage": {"type": "gae", "gamma": 0.99, "lam": 0.95}},
    "ppo_kl_reward": {"advantage": "gae", "kl": {"coef": 0.05, "apply_to": "reward"}},
    "gspo": {"policy_loss": "gspo", "loss_agg": "seq-mean-token-mean"},
    "cispo": {"policy_loss": "cispo"},
    "grpo_tis_kl_per_rollout": {
        "tis": {"cap": 2.0},
        "kl": {"coef": 0.01, "estimator": "k3"},
        "normalize_per_rollout": True,
        "loss_agg": "seq-mean-token-mean",
    },
    "custom": {
        "advantage": {"type": "custom", "path": "my_custom_algos:scaled_reward"},
        "policy_loss": {"type": "custom", "path": "my_custom_algos:vanilla_reinforce"},
    },
}


@pytest.mark.parametrize("name", list(RL_ALGORITHMS))
def test_rl_algorithm_trains(fresh: Tiny, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    cfg = AlgorithmConfig.model_validate(RL_ALGORITHMS[name])
    losses = _train(fresh, _rl_batch(), cfg)
    assert all(math.isfinite(loss) for loss in losses)
    assert _changed(fresh)


def test_sft_trains_from_file_and_lowers_nll(fresh: Tiny) -> None:
    samples = load_sft_samples(DATA / "sft_tiny.jsonl", fresh.renderer)
    samples = [s for s in samples if len(s.token_ids) < 64]  # the long tool schema is slow on CPU
    losses = _train(fresh, _offline_batch(samples, fresh.pad_id), _cfg("sft"), steps=2)
    assert _changed(fresh)
    assert losses[-1] < losses[0]  # NLL of the demonstrations goes down


def test_dpo_trains_from_file_and_raises_the_margin(fresh: Tiny) -> None:
    samples = load_dpo_samples(DATA / "dpo_tiny.jsonl", fresh.renderer)
    # Two micro-batches that keep each pair together: pairs 0 and 1, then pair 2.
    losses = _train(fresh, _offline_batch(samples, fresh.pad_id), _cfg("dpo"), steps=2, split=4)
    assert _changed(fresh)
    assert losses[0] == pytest.approx(math.log(2.0), abs=1e-4)  # policy == reference at first
    assert losses[-1] < losses[0]


def test_sft_rl_mix_trains(fresh: Tiny) -> None:
    rl = _rl_batch()
    sft_samples = load_sft_samples(DATA / "sft_tiny.jsonl", fresh.renderer)[:2]
    sft_ids, sft_mask = _pad(sft_samples, fresh.pad_id)
    length = max(rl.ids.shape[1], sft_ids.shape[1])

    def widen(t: Tensor, fill: int | float) -> Tensor:
        return F.pad(t, (0, length - t.shape[1]), value=fill)

    mixed = Batch(
        ids=torch.cat([widen(rl.ids, fresh.pad_id), widen(sft_ids, fresh.pad_id)]),
        mask=torch.cat([widen(rl.mask, 0), widen(sft_mask, 0)]),
        rewards=torch.cat([rl.rewards, torch.zeros(2)]),
        group_ids=torch.cat([rl.group_ids, torch.tensor([8, 9])]),
        episode_ids=torch.cat([rl.episode_ids, torch.tensor([8, 9])]),
        token_rewards=torch.cat([widen(rl.token_rewards, 0.0), torch.zeros(2, length)]),
        kinds=torch.cat([rl.kinds, encode_sample_kinds(["sft", "sft"])]),
        pair_index=torch.zeros(8, dtype=torch.long),
    )
    cfg = _cfg("sft_rl_mix", sft_mix={"mu_peak": 0.5, "mu_valley": 0.1, "decay_steps": 2})
    losses = _train(fresh, mixed, cfg)
    assert all(math.isfinite(loss) for loss in losses)
    assert _changed(fresh)


def _cfg(objective: str, **algorithm: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate({"objective": objective, **algorithm})
