"""MonitorConfig: defaults, short YAML, unknown keys."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from agentscope_rft.monitor import DEFAULT_CONSOLE_METRICS, MonitorConfig


def test_defaults() -> None:
    cfg = MonitorConfig()
    assert cfg.console and cfg.tensorboard
    assert not cfg.wandb.enabled and cfg.wandb.mode == "offline"
    assert not cfg.mlflow.enabled and cfg.mlflow.tracking_uri is None
    assert cfg.console_metrics == list(DEFAULT_CONSOLE_METRICS)
    assert cfg.plot_every == 10


def test_short_yaml() -> None:
    data = yaml.safe_load("wandb: {enabled: true, project: my-agent, tags: [grpo]}\nplot_every: 0")
    cfg = MonitorConfig.model_validate(data)
    assert cfg.wandb.project == "my-agent" and cfg.wandb.tags == ["grpo"]
    assert cfg.plot_every == 0


def test_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(
        ValidationError, match=r"unknown WandbConfig key 'projet'.*did you mean 'project'"
    ):
        MonitorConfig.model_validate({"wandb": {"projet": "x"}})
    with pytest.raises(ValidationError, match="did you mean 'tensorboard'"):
        MonitorConfig.model_validate({"tensorbord": False})


def test_invalid_values() -> None:
    with pytest.raises(ValidationError, match="plot_every"):
        MonitorConfig(plot_every=-1)
    with pytest.raises(ValidationError, match="mode"):
        MonitorConfig.model_validate({"wandb": {"mode": "offlin"}})
    with pytest.raises(ValidationError, match="lists kl/mean more than once"):
        MonitorConfig(console_metrics=["kl/mean", "kl/mean"])


def test_every_field_is_documented() -> None:
    from agentscope_rft.monitor import MlflowConfig, WandbConfig

    for model in (MonitorConfig, WandbConfig, MlflowConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
