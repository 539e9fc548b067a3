"""`trainer: {type: verl, ...}`: parsing, and every bad setting failing before any work."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import (
    ConfigError,
    TorchTrainerConfig,
    VerlTrainerConfig,
    load_config,
)

BASE = ["workflow=app.py:run", "tasks.train=tasks.jsonl"]


def test_one_line_switches_the_trainer() -> None:
    assert isinstance(load_config(None, BASE).trainer, TorchTrainerConfig)
    assert isinstance(load_config(None, [*BASE, "trainer.lr=1e-5"]).trainer, TorchTrainerConfig)
    verl = load_config(None, [*BASE, "trainer=verl"]).trainer
    assert isinstance(verl, VerlTrainerConfig)
    assert (verl.strategy, verl.world_size, verl.micro_batch_size) == ("fsdp2", 1, None)
    config = load_config(
        None,
        [
            *BASE,
            "trainer.type=verl",
            "trainer.n_gpus_per_node=4",
            "trainer.nnodes=2",
            "trainer.lr=2e-6",
            "trainer.lora.rank=8",
            "trainer.ray.address=auto",
        ],
    ).trainer
    assert isinstance(config, VerlTrainerConfig)
    assert (config.world_size, config.lr, config.ray.address) == (8, 2e-6, "auto")
    assert config.lora is not None and config.lora.rank == 8
    # the resolved config saved in the run folder loads back the same (resume)
    import yaml

    from agentscope_rft.config import RunConfig, dump_config

    saved = load_config(None, [*BASE, "trainer.type=verl", "trainer.nnodes=2"])
    assert RunConfig.model_validate(yaml.safe_load(dump_config(saved))) == saved
    # the shared settings mean the same thing in both trainers
    shared = set(TorchTrainerConfig.model_fields) & set(VerlTrainerConfig.model_fields)
    assert {"lr", "micro_batch_tokens", "mini_batches", "epochs", "lora", "dtype"} <= shared


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.n_gpu_per_node=2", "'n_gpu_per_node'; did you mean 'n_gpus_per_node'"),
        ("trainer.strategy=fsdp3", "trainer.strategy: Input should be 'fsdp2' or 'fsdp'"),
        ("trainer.fsdp_size=0", "fsdp_size must be -1"),
        ("trainer.micro_batch_size=0", "greater than or equal to 1"),
        ("trainer.ray.adress=auto", "did you mean 'address'"),
    ],
)
def test_bad_keys_and_values_name_the_fix(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, "trainer.type=verl", override])


def test_the_factory_imports_verl_only_for_a_verl_trainer() -> None:
    import agentscope_rft

    code = (
        "import sys\n"
        "import agentscope_rft.trainers.factory, agentscope_rft.trainers.torch_trainer\n"
        "assert agentscope_rft.trainers.factory.__file__.startswith(sys.argv[1])\n"
        "assert not [m for m in sys.modules if m == 'verl' or m.startswith('verl.')]\n"
    )
    package = str(Path(agentscope_rft.__file__).parent)
    root = str(Path(package).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code, package], check=True, timeout=120, env=env)


verl = pytest.importorskip("verl", reason="verl is not installed")

from agentscope_rft.trainers.verl import compat, placement  # noqa: E402
from agentscope_rft.trainers.verl.placement import VerlConfigError  # noqa: E402
from agentscope_rft.trainers.verl.settings import plan  # noqa: E402


def _plan(algorithm: dict | None = None, batch_size: int | None = None, **trainer: object):
    config = VerlTrainerConfig(**{"device": "cpu", **trainer})  # type: ignore[arg-type]
    algo = AlgorithmConfig.model_validate(algorithm or {})
    return plan(config, "/unused", algo, optimizer_steps=10, seed=0, batch_size=batch_size)


def test_derived_values_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl"):
        result = _plan({"kl": {"coef": 0.01}}, batch_size=32, micro_batch_tokens=4096)
    assert not result.use_ray and result.settings.reference
    assert result.settings.max_tokens_per_micro_batch == 4096
    assert result.settings.param_dtype == "fp32"
    assert "micro-batches of <= 4096 tokens per rank" in caplog.text
    assert "dtype auto -> fp32" in caplog.text
    assert "1 rank(s) -> in this process" in caplog.text
    layout = _plan(batch_size=16, n_gpus_per_node=2, micro_batch_size=2, mini_batches=2).layout
    assert (layout.dp_size, layout.rows_per_rank, layout.micro_batches_per_rank) == (2, 4, 2)


@pytest.mark.parametrize(
    ("algorithm", "trainer", "batch_size", "message"),
    [
        ({"advantage": "gae"}, {}, None, "needs a critic"),
        ({"objective": "dpo"}, {}, None, "use `trainer: {type: torch}` for DPO"),
        ({}, {"lora": {"dropout": 0.1}}, None, "has no dropout; set it to 0"),
        ({}, {"strategy": "fsdp"}, None, "use strategy 'fsdp2' for device 'cpu'"),
        ({}, {"micro_batch_size": 4}, 10, "micro_batch_size 4 does not divide"),
        ({}, {"n_gpus_per_node": 4}, 6, "does not split across 4"),
        ({}, {"mini_batches": 4}, 6, "does not split into trainer.mini_batches 4"),
        ({}, {"device": "cuda"}, None, "no CUDA device is visible"),
    ],
)
def test_bad_settings_fail_before_any_work(
    algorithm: dict, trainer: dict, batch_size: int | None, message: str
) -> None:
    with pytest.raises(VerlConfigError, match=message):
        _plan(algorithm, batch_size, **trainer)


def test_more_gpus_than_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "visible_cuda_devices", lambda: 2)
    with pytest.raises(VerlConfigError, match="asks for 4 GPUs on 1 node"):
        _plan(device="cuda", n_gpus_per_node=4)
    with pytest.raises(VerlConfigError, match="LoRA with strategy 'fsdp'"):
        _plan(device="cuda", strategy="fsdp", lora={"rank": 4})
    result = _plan(device="cuda", n_gpus_per_node=2)
    assert result.use_ray and result.settings.param_dtype == "bf16"


def test_unsupported_verl_version_fails_first(monkeypatch: pytest.MonkeyPatch) -> None:
    real = compat.installed_version
    monkeypatch.setattr(
        compat,
        "installed_version",
        lambda package: Version("0.10.0") if package == "verl" else real(package),
    )
    with pytest.raises(compat.VerlVersionError, match=r"supports verl==0\.9\.1 only"):
        _plan({"advantage": "gae"})  # the version is checked before anything else


def test_a_verl_setting_that_cannot_work_is_one_line_from_the_cli(tiny_model_path, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "hi"}\n')
    app = Path(__file__).parents[2] / "integration" / "toy_app.py"
    sets = [
        f"model.name_or_path={tiny_model_path}",
        f"workflow={app}:run",
        f"tasks.train={tasks}",
        "trainer.type=verl",
        "algorithm.advantage=gae",
        f"run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentscope_rft.cli",
            "train",
            *[a for s in sets for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "1000"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: advantage 'gae' needs a critic" in " ".join(proc.stderr.split())
