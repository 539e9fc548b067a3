"""Build the configured trainer."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TrainerConfig, VerlTrainerConfig
from agentscope_rft.trainers.base import Trainer


def build_trainer(
    config: TrainerConfig,
    model_path: Path,
    algorithm: AlgorithmConfig,
    *,
    total_steps: int,
    seed: int,
    batch_size: int | None = None,
) -> Trainer:
    """Create the trainer for `config.type`: `torch`, or `verl` (imported only then, so a
    torch-only install never imports verl).

    `batch_size` (nominal samples per step, when known) lets the verl trainer check up front that
    its mini-batches split into ranks x micro-batches.

    Example:
        >>> trainer = build_trainer(TorchTrainerConfig(), path, AlgorithmConfig(),
        ...                         total_steps=10, seed=0)  # doctest: +SKIP
    """
    if isinstance(config, VerlTrainerConfig):
        from agentscope_rft.trainers.verl.trainer import VerlTrainer

        return VerlTrainer(
            model_path,
            config,
            algorithm,
            total_steps=total_steps,
            seed=seed,
            batch_size=batch_size,
        )
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    return TorchTrainer(model_path, config, algorithm, total_steps=total_steps, seed=seed)
