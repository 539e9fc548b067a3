"""Bad verl trainer configs fail before any work, with a message naming the fix."""

from __future__ import annotations

import logging

import pytest
from packaging.version import Version

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

from agentscope_rft.trainers.verl import compat
from agentscope_rft.trainers.verl.engine import VerlEngineSettings
from agentscope_rft.trainers.verl.placement import VerlConfigError, plan_layout


def _settings(**overrides: object) -> VerlEngineSettings:
    values: dict = {"model_path": "unused", "device": "cpu", "micro_batch_size": 2, **overrides}
    return VerlEngineSettings(**values)


def test_layout_is_derived_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl.placement"):
        layout = plan_layout(_settings(), num_devices=2, batch_size=8)
    assert (layout.dp_size, layout.rows_per_rank, layout.micro_batches_per_rank) == (2, 4, 2)
    assert "8 samples per step -> 4 per rank -> 2 micro-batch(es) of 2" in caplog.text


def test_hybrid_sharding_and_dynamic_micro_batches() -> None:
    settings = _settings(device="cuda", fsdp_size=4, max_tokens_per_micro_batch=4096)
    layout = plan_layout(settings, num_devices=16, batch_size=64, devices_per_node=8, num_nodes=2)
    assert layout.sharding == "fsdp2 hybrid: shard over 4, replicate x4"
    assert layout.micro_batches_per_rank is None


@pytest.mark.parametrize(
    ("overrides", "kwargs", "message"),
    [
        ({}, {"num_devices": 2, "batch_size": 6}, "micro_batch_size 2 does not divide"),
        ({}, {"num_devices": 4, "batch_size": 6}, "does not split across 4"),
        ({"micro_batch_size": 0}, {"num_devices": 1, "batch_size": 4}, "micro_batch_size must"),
        ({"strategy": "fsdp"}, {"num_devices": 1, "batch_size": 4}, "use strategy 'fsdp2'"),
        ({"fsdp_size": 3}, {"num_devices": 4, "batch_size": 8}, "fsdp_size 3 must divide"),
        (
            {"device": "cuda"},
            {"num_devices": 4, "batch_size": 8, "devices_per_node": 1},
            "asks for 4 GPUs on 1 node",
        ),
        ({"device": "cuda"}, {"num_devices": 1, "batch_size": 8, "devices_per_node": 0}, "no CUDA"),
    ],
)
def test_bad_layouts_are_rejected(overrides: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(VerlConfigError, match=message):
        plan_layout(_settings(**overrides), **kwargs)


def test_versions_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    found = compat.check_versions()
    assert found["verl"] == compat.SUPPORTED_VERL

    real = compat.installed_version

    def fake(package: str) -> Version | None:
        return Version("0.8.0") if package == "verl" else real(package)

    monkeypatch.setattr(compat, "installed_version", fake)
    with pytest.raises(compat.VerlVersionError, match=r"supports verl==0\.9\.1 only"):
        compat.check_versions()

    monkeypatch.setattr(compat, "installed_version", lambda package: None)
    with pytest.raises(compat.VerlVersionError, match=r"agentscope-rft\[verl\]"):
        compat.check_versions()


def test_flash_attention_is_checked_before_the_model_builds(monkeypatch: pytest.MonkeyPatch):
    """It failed inside verl's model build, a traceback per rank, after the run had started."""
    import importlib.util

    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.config import VerlTrainerConfig
    from agentscope_rft.trainers.verl.settings import plan

    def build(device: str) -> None:
        config = VerlTrainerConfig(device=device, attn_implementation="flash_attention_2")
        plan(config, "unused", AlgorithmConfig(), optimizer_steps=1, seed=0, batch_size=4)

    with pytest.raises(VerlConfigError, match="'flash_attention_2' needs CUDA and the trainer"):
        build("cpu")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "flash_attn" else find_spec(name)
    )
    with pytest.raises(VerlConfigError, match="needs the flash-attn package, which is not"):
        build("cuda")
    with pytest.raises(ValueError, match="attn_implementation"):
        VerlTrainerConfig(attn_implementation="spda")  # a typo is refused when the config loads


def test_a_ray_section_for_one_rank_is_said_to_be_unused(caplog: pytest.LogCaptureFixture):
    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.config import VerlTrainerConfig
    from agentscope_rft.trainers.verl.settings import plan

    config = VerlTrainerConfig(device="cpu", ray={"address": "127.0.0.1:1"})
    with caplog.at_level(logging.WARNING, logger="agentscope_rft.trainers.verl.settings"):
        assert not plan(config, "unused", AlgorithmConfig(), optimizer_steps=1, seed=0).use_ray
    assert "trainer.ray.address not used: one rank runs in this process" in caplog.text
