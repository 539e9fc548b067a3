"""Shared by the verl tests: a tiny batch, a PPO-clip loss, and a plain-PyTorch reference step.

The reference is deliberately independent of our conversion code: it works on the flat samples
(right-padded [N, T], column t = token t), computes log-probs with a plain HF forward and takes
one `torch.optim.AdamW` step, fp32. The lead's torch trainer will replace it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from agentscope_rft.trainers.verl.loss import TokenLossInputs
from agentscope_rft.types import Sample

LR = 1e-2
WEIGHT_DECAY = 0.01
MAX_GRAD_NORM = 1.0

TRAINER_LR = 1e-2
TRAINER_SETTINGS = {"lr": TRAINER_LR, "weight_decay": 0.01, "grad_clip": 1.0, "dtype": "float32"}
"""Settings shared by the torch and verl trainers in the trainer-equality tests."""


def ppo_clip_loss(x: TokenLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean PPO-clip loss (eps 0.2), written out independently of verl's."""
    ratio = torch.exp(x.logprobs - x.old_logprobs)
    per_token = -torch.min(ratio * x.advantages, ratio.clamp(0.8, 1.2) * x.advantages)
    loss = (per_token * x.mask).sum() / x.mask.sum()
    return loss, {"pg_loss": float(loss.detach())}


def make_samples(num: int = 6, seed: int = 0) -> tuple[list[Sample], torch.Tensor]:
    """Samples of different lengths and prompt lengths; even ones are two-turn (a tool result
    masked inside the response). Returns the samples and per-token advantages [N, T]."""
    gen = torch.Generator().manual_seed(seed)
    samples: list[Sample] = []
    for i in range(num):
        n = 6 + 2 * i
        prompt = 2 + i % 3
        mask = [0] * prompt + [1] * (n - prompt)
        if i % 2 == 0:
            mask[prompt + 1] = 0
        logprobs = [(-0.5 - 0.1 * j) if m else 0.0 for j, m in enumerate(mask)]
        samples.append(
            Sample(
                token_ids=torch.randint(3, 4000, (n,), generator=gen).tolist(),
                loss_mask=mask,
                logprobs=logprobs,
                reward=float(i % 2),
                rollout_id=f"r{i}",
                task_id=f"t{i // 2}",
                temperature=1.0 if i % 3 else 0.7,
            )
        )
    width = max(len(s.token_ids) for s in samples)
    advantages = torch.zeros(num, width)
    for i, s in enumerate(samples):
        mask = torch.tensor(list(s.loss_mask), dtype=torch.float32)
        advantages[i, : len(s.token_ids)] = mask * (1.0 if i % 2 else -0.7)
    return samples, advantages


def flat_batch(
    samples: list[Sample], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, loss mask, rollout log-probs, temperatures."""
    width = max(len(s.token_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_token_id)
    attention = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width)
    logprobs = torch.zeros(n, width)
    for i, s in enumerate(samples):
        k = len(s.token_ids)
        ids[i, :k] = torch.tensor(list(s.token_ids))
        attention[i, :k] = 1
        mask[i, :k] = torch.tensor(list(s.loss_mask), dtype=torch.float32)
        logprobs[i, :k] = torch.tensor(list(s.logprobs))
    temperature = torch.tensor([s.temperature for s in samples])
    return ids, attention, mask, logprobs, temperature


def token_logprobs(
    model: torch.nn.Module, samples: list[Sample], pad_token_id: int
) -> torch.Tensor:
    """[N, T] log p(token t | tokens < t) at each sample's temperature; column 0 is 0."""
    ids, attention, _, _, temperature = flat_batch(samples, pad_token_id)
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    logits = logits / temperature[:, None, None]
    picked = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(len(samples), 1), picked], dim=1)


def reference_steps(
    model_path: str, samples: list[Sample], advantages: torch.Tensor, pad_token_id: int, steps: int
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch: `steps` AdamW steps on the whole batch -> losses, grad norms, weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY
    )
    _, _, mask, rollout, _ = flat_batch(samples, pad_token_id)
    losses, grad_norms = [], []
    for _ in range(steps):
        logprobs = token_logprobs(model, samples, pad_token_id)
        inputs = TokenLossInputs(logprobs, rollout, rollout, advantages, mask, None)
        loss, _ = ppo_clip_loss(inputs)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        losses.append(float(loss.detach()))
        grad_norms.append(float(grad_norm))
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, grad_norms, weights


def run_rank(rank: int, world_size: int, port: int, model_path: str, out: str) -> None:
    """One rank of a multi-process verl run (for `torch.multiprocessing.spawn`): two steps."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from agentscope_rft.trainers.verl.convert import build_batch
    from agentscope_rft.trainers.verl.engine import VerlEngineSettings, VerlTrainingEngine
    from agentscope_rft.trainers.verl.loss import VerlLoss

    samples, advantages = make_samples()
    settings = VerlEngineSettings(
        model_path=model_path,
        micro_batch_size=1,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=MAX_GRAD_NORM,
    )
    engine = VerlTrainingEngine(settings, VerlLoss(ppo_clip_loss, weighting="tokens"))
    batch = build_batch(
        samples, advantages, pad_token_id=engine.pad_token_id, multiple_of=engine.batch_multiple
    )
    metrics = [engine.train_step(batch) for _ in range(2)]
    weights = engine.state_dict_for_sync()
    if rank == 0:
        torch.save({"metrics": metrics, "weights": weights, "rows": batch.batch_size[0]}, out)
    Path(out + f".rank{rank}").write_text("done")


def grpo_samples(num: int = 8, seed: int = 0) -> list[Sample]:
    """Groups of 4 with mixed rewards, mixed temperatures, two-turn samples whose tool result
    (inside the trained span) is masked, and engine log-probs a little off the policy's."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(num):
        n = 8 + 3 * (i % 4)
        prompt = 3 + i % 3
        mask = [0] * prompt + [1] * (n - prompt)
        if i % 2 == 0:
            mask[prompt + 2] = 0
        ids = torch.randint(3, 4000, (n,), generator=gen).tolist()
        logprobs = [(-9.0 - 0.3 * j) if m else 0.0 for j, m in enumerate(mask)]
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=mask,
                logprobs=logprobs,
                reward=float((i * 7) % 3) / 2,
                rollout_id=f"r{i}",
                task_id=f"t{i // 4}",
                temperature=1.0 if i % 3 else 0.7,
            )
        )
    return samples


def run_steps(trainer: Any, samples: list[Sample], steps: int) -> list[dict[str, float]]:
    out = []
    for step in range(steps):
        torch.manual_seed(100 + step)  # same mini-batch permutation in both trainers
        out.append(trainer.step(samples, step))
    return out
