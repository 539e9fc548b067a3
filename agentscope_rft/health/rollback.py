"""What rollbacks have changed so far: their count, the learning-rate scale, KL and entropy
coefficients, the step the last one restored. Saved in `state.json` and in every checkpoint, so
a resumed run keeps them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from agentscope_rft.algorithms.config import AlgorithmConfig, KLConfig
from agentscope_rft.health.config import RollbackSettings


@dataclass(frozen=True, slots=True)
class RollbackState:
    """The changes in force after `rollbacks` rollbacks.

    Example:
        >>> state = RollbackState().after(RollbackSettings(lr_factor=0.5, entropy_coef=0.01))
        >>> state.rollbacks, state.lr_scale, state.entropy_coef
        (1, 0.5, 0.01)
    """

    rollbacks: int = 0
    lr_scale: float = 1.0
    """The learning rate is `lr_scale` x `trainer.lr` (and its schedule)."""
    kl_coef: float | None = None
    entropy_coef: float | None = None
    restored: int | None = None
    """The step the last rollback went back to: a problem found again from there needs a
    checkpoint before it (pruning keeps one)."""

    def after(self, settings: RollbackSettings, restored: int | None = None) -> RollbackState:
        """The state after one more rollback (to the checkpoint of step `restored`)."""
        return replace(
            self,
            rollbacks=self.rollbacks + 1,
            restored=restored,
            lr_scale=self.lr_scale * settings.lr_factor,
            kl_coef=settings.kl_coef if settings.kl_coef is not None else self.kl_coef,
            entropy_coef=(
                settings.entropy_coef if settings.entropy_coef is not None else self.entropy_coef
            ),
        )

    def algorithm(self, configured: AlgorithmConfig) -> AlgorithmConfig:
        """The configured algorithm with these changes."""
        update: dict[str, Any] = {}
        if self.kl_coef is not None:
            kl = configured.kl or KLConfig()
            update["kl"] = kl.model_copy(update={"coef": self.kl_coef})
        if self.entropy_coef is not None:
            update["entropy_coef"] = self.entropy_coef
        return configured.model_copy(update=update) if update else configured

    def describe(self) -> str:
        parts = [f"lr x{self.lr_scale:g}"]
        if self.kl_coef is not None:
            parts.append(f"KL coef {self.kl_coef:g}")
        if self.entropy_coef is not None:
            parts.append(f"entropy coef {self.entropy_coef:g}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RollbackState:
        names = ("rollbacks", "lr_scale", "kl_coef", "entropy_coef", "restored")
        known = {k: data[k] for k in names if k in data}
        return cls(**known)
