"""The trainer contract: what the training loop needs from a trainer (torch or verl)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from torch import Tensor

from agentscope_rft.algorithms.config import AlgorithmConfig
from agentscope_rft.types import Sample


class Trainer(Protocol):
    """Updates the policy from batches of samples.

    Example:
        >>> metrics = trainer.step(samples, step=3)  # doctest: +SKIP
        >>> await engine.load_weights(trainer.state_dict_for_sync(), version=4)  # doctest: +SKIP
    """

    def step(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        """Train on one batch (advantages, losses, optimizer steps); returns metrics."""
        ...

    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """The current policy's full HF-named weights (LoRA merged) for the inference engine."""
        ...

    def export_hf(self, target: Path) -> None:
        """Write the current policy as an HF model folder (weights, config, tokenizer)."""
        ...

    def save(self, directory: Path) -> None:
        """Everything needed to resume exactly (weights or adapter, optimizer, schedule, RNG)."""
        ...

    def load(self, directory: Path) -> None: ...

    def adjust(self, lr_scale: float, algorithm: AlgorithmConfig) -> None:
        """Train from now on at `lr_scale` x the configured learning rate, with `algorithm`
        (a health rollback's changes); a trainer that cannot raises `NotImplementedError`."""
        ...

    def close(self) -> None: ...
