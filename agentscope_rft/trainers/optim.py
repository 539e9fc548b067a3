"""AdamW with its two moments kept in bf16: half the optimizer memory of torch's AdamW.

A full fine-tune's fixed memory is fp32 weights (4 bytes a parameter), gradients (4) and AdamW's
two fp32 moments (8): 16 bytes a parameter, 2.15 GB for SmolLM2-135M, most of what a small laptop
can give a run. `trainer.optimizer_state_dtype: bfloat16` keeps both moments in bf16 (4 bytes a
parameter instead of 8). Each step computes in fp32, a chunk of one parameter at a time in
buffers it reuses (so no temporary is a parameter's size), and stores the moments back with
stochastic rounding: rounding to the nearest bf16 would lose the second moment's decay (with
beta2 = 0.999 a step changes it by 0.1%, under bf16's 0.4% resolution) and freeze it; stochastic
rounding keeps every stored moment unbiased, so their expectation follows fp32 AdamW. The
weights stay fp32.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(4))
    >>> opt = BF16StateAdamW([w], lr=0.1, weight_decay=0.0)
    >>> w.grad = torch.ones(4)
    >>> opt.step()
    >>> opt.state[w]["exp_avg"].dtype, round(float(w[0]), 4)
    (torch.bfloat16, 0.9)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


def stochastic_round_to_bf16(value: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """`value` (fp32) rounded to bf16 at random, up or down with the probabilities that make the
    result's expectation `value` (random low 16 bits added to the fp32 pattern, then cut)."""
    out = value.float().contiguous().clone()
    noise = torch.empty_like(out, dtype=torch.int32).random_(0, 1 << 16, generator=generator)
    _stochastic_round_(out, noise)
    return out.to(torch.bfloat16)  # exact: the low 16 bits are zero


CHUNK = 1 << 20
"""Elements of one parameter updated at a time (4 MiB fp32 buffers, allocated once)."""


def _stochastic_round_(value: Tensor, noise: Tensor) -> None:
    """`stochastic_round_to_bf16` in place: `value` (fp32, contiguous) keeps the bf16 it rounds
    to, its low 16 bits zero; `noise` (int32, same size, uniform in [0, 2^16)) is added to the
    low 16 bits (a carry rounds up) and may be overwritten. Finite values cannot carry into the
    sign bit, so a chunk that is all finite takes two in-place operations; inf and nan pass
    through unrounded (their bits plus noise would be another nan)."""
    bits = value.view(torch.int32)
    finite = torch.isfinite(value)
    if bool(finite.all()):
        bits.add_(noise).bitwise_and_(-65536)  # sign, exponent and 7 mantissa bits
        return
    noise.add_(bits).bitwise_and_(-65536)
    bits.bitwise_and_(-65536)
    torch.where(finite, noise, bits, out=bits)


class BF16StateAdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (torch's AdamW update, `amsgrad` off) with bf16 moments.

    The state dict holds the bf16 moments as they are, so a checkpoint is half the size too and a
    resumed run continues from the exact same state.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        seed: int = 0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0: {lr}, {eps}, {weight_decay}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be in [0, 1): {betas}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self._generator = torch.Generator().manual_seed(seed)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._scratch: dict[torch.device, tuple[Tensor, Tensor, Tensor, Tensor]] = {}

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if device.type == "cpu":
            return self._generator
        if device not in self._generators:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._generator))
            self._generators[device] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[device]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    zeros = {"dtype": torch.bfloat16, "device": param.device}
                    state["exp_avg"] = torch.zeros(param.shape, **zeros)
                    state["exp_avg_sq"] = torch.zeros(param.shape, **zeros)
                state["step"] += 1
                self._update(param, state, group)
        return loss

    def _update(self, param: Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """One parameter's AdamW update, `CHUNK` elements at a time in reused fp32 buffers: no
        temporary of the parameter's size (each would be mapped and zeroed afresh where glibc maps
        large blocks, `run.allocator: glibc-compact`)."""
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        step = float(state["step"])
        bias1, bias2 = 1 - beta1**step, 1 - beta2**step
        generator = self._generator_for(param.device)
        m32, v32, denom, noise = self._buffers(param.device)
        weights = param.data.view(-1) if param.data.is_contiguous() else None
        flat = weights if weights is not None else param.data.reshape(-1).clone()
        assert param.grad is not None  # (step skips parameters without one)
        grad = param.grad.reshape(-1)
        for key in ("exp_avg", "exp_avg_sq"):  # (loaded state may come with other strides)
            state[key] = state[key].contiguous()
        moments = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
        for begin in range(0, flat.numel(), CHUNK):
            end = min(begin + CHUNK, flat.numel())
            size = end - begin
            g, w = grad[begin:end], flat[begin:end]
            m, v, d, n = m32[:size], v32[:size], denom[:size], noise[:size]
            m.copy_(moments[0][begin:end]).mul_(beta1).add_(g, alpha=1 - beta1)
            v.copy_(moments[1][begin:end]).mul_(beta2).addcmul_(g, g, value=1 - beta2)
            if decay:
                w.mul_(1 - lr * decay)
            torch.div(v, bias2, out=d).sqrt_().add_(eps)
            w.addcdiv_(m, d, value=-lr / bias1)
            # One 31-bit draw per element rounds both moments: bits 0-15 the second, bits 15-30
            # the first (each uniform in [0, 2^16), so each rounding is unbiased; they share one
            # bit, a correlation of 2e-5). Half the draws of one per moment, the slow part.
            n.random_(generator=generator)
            high = torch.bitwise_right_shift(n, 15, out=d.view(torch.int32))
            _stochastic_round_(m, high)
            _stochastic_round_(v, n.bitwise_and_(0xFFFF))
            moments[0][begin:end].copy_(m)  # exact: the low 16 bits are zero
            moments[1][begin:end].copy_(v)
        if weights is None:
            param.data.copy_(flat.view_as(param))

    def _buffers(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Three fp32 buffers and one int32 buffer of `CHUNK` elements, kept per device."""
        if device not in self._scratch:
            m, v, d = (torch.empty(CHUNK, dtype=torch.float32, device=device) for _ in range(3))
            self._scratch[device] = (m, v, d, torch.empty(CHUNK, dtype=torch.int32, device=device))
        return self._scratch[device]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded state to each parameter's dtype (fp32): the moments go back to
        bf16, exactly as they were saved (bf16 -> fp32 -> bf16 is exact), and the rounding's
        random stream continues where it was."""
        state_dict = dict(state_dict)
        rng = state_dict.pop("bf16_state_rng", None)
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)
        if rng is not None:
            self._generator.set_state(rng)
        self._generators.clear()

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["bf16_state_rng"] = self._generator.get_state()
        return out


def optimizer_bytes_per_parameter(state_dtype: str) -> int:
    """Bytes of AdamW state per trained parameter: two moments of the state dtype."""
    return 2 * (2 if state_dtype == "bfloat16" else 4)


def set_base_lrs(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    bases: Iterable[float | Tensor],
) -> None:
    """Give each parameter group of `optimizer` the base learning rate in `bases` (one per
    group), keeping the schedule's position: the current lr becomes base x the schedule's factor
    at its present step. Used by a health rollback's lr change and by a checkpoint load, where
    the config's lr (possibly changed by `--set` or a fork) wins over the checkpoint's."""
    bases = [float(base) for base in bases]
    for group, base, factor in zip(
        optimizer.param_groups, bases, scheduler.lr_lambdas, strict=True
    ):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler.base_lrs = bases
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


__all__ = [
    "BF16StateAdamW",
    "optimizer_bytes_per_parameter",
    "set_base_lrs",
    "stochastic_round_to_bf16",
]
