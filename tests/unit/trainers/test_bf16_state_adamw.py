"""`trainer.optimizer_state_dtype: bfloat16`: AdamW with bf16 moments (stochastic rounding)."""

from __future__ import annotations

import io

import pytest
import torch

from agentscope_rft.trainers.optim import BF16StateAdamW, stochastic_round_to_bf16


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbouring_bf16_values() -> None:
    generator = torch.Generator().manual_seed(0)
    for value in (1.0 + 1 / 512, -3.3, 7.77e-6):
        x = torch.full((100_000,), value)
        rounded = stochastic_round_to_bf16(x, generator)
        assert rounded.dtype == torch.bfloat16
        assert len(rounded.unique()) == 2  # the bf16 values just below and just above
        assert rounded.float().mean().item() == pytest.approx(value, rel=2e-4)
    special = torch.tensor([float("inf"), -float("inf"), 0.0, -2.0])
    assert torch.equal(stochastic_round_to_bf16(special).float(), special)
    assert stochastic_round_to_bf16(torch.tensor([float("nan")])).isnan().all()


def test_the_first_step_is_torch_adamw_exactly() -> None:
    torch.manual_seed(0)
    grad = torch.randn(64, 32)
    ours, theirs = (torch.nn.Parameter(torch.randn(64, 32)) for _ in range(2))
    theirs.data.copy_(ours.data)
    a = BF16StateAdamW([ours], lr=1e-2, weight_decay=0.1)
    b = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1)
    ours.grad, theirs.grad = grad.clone(), grad.clone()
    a.step()
    b.step()
    assert torch.allclose(ours, theirs, atol=1e-7)
    assert a.state[ours]["exp_avg"].dtype == torch.bfloat16
    state_bytes = sum(t.numel() * t.element_size() for t in a.state[ours].values())
    theirs_bytes = sum(t.numel() * t.element_size() for t in b.state[theirs].values())
    assert state_bytes < 0.51 * theirs_bytes  # half the memory (the step counter aside)


def test_a_parameter_larger_than_a_chunk_or_not_contiguous_updates_as_one(monkeypatch) -> None:
    from agentscope_rft.trainers import optim

    monkeypatch.setattr(optim, "CHUNK", 7)  # 64 x 32 elements: 293 chunks, the last one short
    torch.manual_seed(0)
    base, grads = torch.randn(32, 64), [torch.randn(64, 32) for _ in range(3)]
    ours = torch.nn.Parameter(base.clone().t())  # a transposed view: not contiguous
    theirs = torch.nn.Parameter(base.clone().t().contiguous())
    assert not ours.data.is_contiguous()
    a = BF16StateAdamW([ours], lr=1e-2, weight_decay=0.1)
    b = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1)
    for step, grad in enumerate(grads):
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        a.step()
        b.step()
        if step == 0:  # the first step reads no rounded moment: exactly torch's
            assert torch.allclose(ours, theirs, atol=1e-7)
    torch.testing.assert_close(ours.data, theirs.data, rtol=0, atol=2e-4)
    assert a.state[ours]["exp_avg"].shape == ours.shape
    assert all(len(buffer) == 7 for buffer in a._scratch[torch.device("cpu")])


@pytest.mark.parametrize(
    ("key", "beta", "steps", "stalls_below"),
    [
        # fp32's second moment is 1 - 0.999**n (0.63 at n=1000): each step changes it by 0.1%,
        # under bf16's resolution, so rounded to the nearest bf16 it stalls far below (at 0.25,
        # from step ~290 on; 1000 steps show it as well as the 3000 this ran before, in 1/3 the
        # time).
        ("exp_avg_sq", 0.999, 1000, 0.8 * (1 - 0.999**1000)),
        # The first moment, 1 - 0.9**n (1.0 at n=200): near 1 a step changes it by 0.1 x (1 - m),
        # under bf16's resolution once m > 0.98. The optimizer rounds it with other random bits
        # of the same draw (bits 15-30).
        ("exp_avg", 0.9, 200, 0.99),
    ],
)
def test_each_moment_follows_fp32_where_round_to_nearest_stalls(
    key: str, beta: float, steps: int, stalls_below: float
) -> None:
    # A constant gradient of 1; the moments rounded at random stay on fp32's course (why the
    # optimizer rounds at random), nearest rounding stalls.
    size = 2000
    param = torch.nn.Parameter(torch.zeros(size))
    opt = BF16StateAdamW([param], lr=0.0, seed=1)
    nearest = torch.zeros(size, dtype=torch.bfloat16)
    for _ in range(steps):
        param.grad = torch.ones(size)
        opt.step()
        nearest = (nearest.float() * beta + (1 - beta)).to(torch.bfloat16)
    expected = 1 - beta**steps
    assert opt.state[param][key].float().mean().item() == pytest.approx(expected, rel=5e-3)
    assert nearest.float().mean().item() < stalls_below


def test_a_training_run_follows_torch_adamw_closely() -> None:
    torch.manual_seed(0)
    target = torch.randn(256)
    ours, theirs = torch.nn.Parameter(torch.zeros(256)), torch.nn.Parameter(torch.zeros(256))
    a, b = BF16StateAdamW([ours], lr=1e-2), torch.optim.AdamW([theirs], lr=1e-2)
    noise = torch.Generator().manual_seed(3)
    for _ in range(400):
        jitter = 0.1 * torch.randn(256, generator=noise)
        for param, opt in ((ours, a), (theirs, b)):
            param.grad = 2 * (param.detach() - target) + jitter
            opt.step()
    assert (ours - target).norm() < 0.1 * target.norm()  # it converged
    assert (ours - theirs).norm() < 0.02 * target.norm()  # alongside fp32 AdamW


def test_a_saved_state_resumes_exactly_and_stays_bf16() -> None:
    torch.manual_seed(0)
    grads = [torch.randn(32) for _ in range(6)]
    param = torch.nn.Parameter(torch.randn(32))
    start = param.detach().clone()
    opt = BF16StateAdamW([param], lr=1e-2, weight_decay=0.01, seed=5)
    for grad in grads[:3]:
        param.grad = grad.clone()
        opt.step()
    buffer = io.BytesIO()
    torch.save({"param": param.detach().clone(), "opt": opt.state_dict()}, buffer)
    for grad in grads[3:]:
        param.grad = grad.clone()
        opt.step()
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    resumed = torch.nn.Parameter(saved["param"])
    again = BF16StateAdamW([resumed], lr=1e-2, weight_decay=0.01, seed=99)  # seed from the state
    again.load_state_dict(saved["opt"])
    assert again.state[resumed]["exp_avg_sq"].dtype == torch.bfloat16
    for grad in grads[3:]:
        resumed.grad = grad.clone()
        again.step()
    assert torch.equal(resumed, param) and not torch.equal(param, start)


def test_bad_settings_are_refused() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="betas"):
        BF16StateAdamW([param], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr, eps and weight_decay"):
        BF16StateAdamW([param], lr=-1.0)
