"""Keys the user set that do nothing in the resolved config are named, one line each, with why
and what to do; defaults, keys that act, and the keys of a saved config its user never set are
not."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentscope_rft.config import RunConfig, dump_config, load_config
from agentscope_rft.config_effect import no_effect, warn_no_effect
from agentscope_rft.runtime.sweep import seed_command

BASE = ["workflow=app.py:run", "tasks.train=t.jsonl"]
OFFLINE_SFT = ["run.mode=offline", "offline.path=d.jsonl", "algorithm.objective=sft"]
VLLM = ["engine.type=vllm"]

# (key, sets where it does nothing, sets where it acts); every rule of config_effect.RULES.
CASES = [
    ("run.max_staleness", ["run.max_staleness=4"], ["run.max_staleness=4", "run.mode=async"]),
    (
        "run.max_staleness",
        [*OFFLINE_SFT, "run.max_staleness=4"],
        ["run.max_staleness=4", "run.mode=train_only", "buffer.type=sql"],
    ),
    ("run.eval_every", ["run.eval_every=2"], ["run.eval_every=2", "tasks.eval=e.jsonl"]),
    (
        "run.get_timeout",
        [*OFFLINE_SFT, "run.get_timeout=60"],
        ["run.get_timeout=60"],
    ),
    (
        "explorer.tasks_per_step",
        [*OFFLINE_SFT, "explorer.tasks_per_step=4"],
        ["run.mode=train_only", "buffer.type=sql", "explorer.tasks_per_step=4"],
    ),
    (
        "run.eval_every",
        [*OFFLINE_SFT, "tasks.val=v.jsonl", "run.eval_every=2"],
        ["tasks.val=v.jsonl", "run.eval_every=2"],
    ),
    (
        "run.best_metric",
        ["tasks.val=v.jsonl", "run.best_metric=val/success_rate"],
        ["tasks.val=v.jsonl", "run.best_metric=val/success_rate", "run.eval_every=2"],
    ),
    (
        "run.best_mode",
        ["tasks.eval=e.jsonl", "run.eval_every=2", "run.best_mode=min"],
        ["tasks.val=v.jsonl", "run.eval_every=2", "run.best_mode=min"],
    ),
    ("tasks.val", ["tasks.val=v.jsonl"], ["tasks.val=v.jsonl", "run.eval_every=2"]),
    (
        "health.rules.entropy_collapse.action",
        [*OFFLINE_SFT, "health.rules.entropy_collapse.action=stop"],
        ["health.rules.entropy_collapse.action=stop"],
    ),
    ("tasks.val_limit", ["tasks.val_limit=3"], ["tasks.val_limit=3", "tasks.val=v.jsonl"]),
    ("tasks.eval_limit", ["tasks.eval_limit=3"], ["tasks.eval_limit=3", "tasks.eval=e.jsonl"]),
    (
        "tasks.stratify_field",
        ["tasks.stratify_field=kind"],
        ["tasks.stratify_field=kind", "tasks.eval=e.jsonl"],
    ),
    (
        "explorer.eval_sampling.temperature",
        ["explorer.eval_sampling.temperature=0.5"],
        ["explorer.eval_sampling.temperature=0.5", "tasks.val=v.jsonl"],
    ),
    (
        "explorer.eval_group_size",
        [*OFFLINE_SFT, "explorer.eval_group_size=4"],
        [*OFFLINE_SFT, "explorer.eval_group_size=4", "tasks.eval=e.jsonl"],
    ),
    ("tasks.shuffle", ["tasks.shuffle=false", "data.selector=curriculum"], ["tasks.shuffle=false"]),
    (
        "explorer.reward_gamma",
        ["explorer.reward_gamma=0.9"],
        ["explorer.reward_gamma=0.9", "explorer.reward_spread=discounted"],
    ),
    (
        "algorithm.entropy_coef",
        [*OFFLINE_SFT, "algorithm.entropy_coef=0.01"],
        ["algorithm.entropy_coef=0.01"],
    ),
    (
        "algorithm.kl.coef",
        [*OFFLINE_SFT, "algorithm.kl={coef: 0.01}"],
        ["algorithm.kl={coef: 0.01}"],
    ),
    (
        "algorithm.critic.vf_coef",
        ["algorithm.critic.vf_coef=0.5"],
        ["algorithm.critic.vf_coef=0.5", "algorithm.advantage=gae"],
    ),
    (
        "algorithm.tis.cap",
        ["algorithm.tis={cap: 2.0}"],
        ["algorithm.tis={cap: 2.0}", "trainer.old_logprobs=recompute"],
    ),
    (
        "algorithm.filter_zero_variance_groups",
        ["algorithm.filter_zero_variance_groups=false", "algorithm.advantage=gae"],
        ["algorithm.filter_zero_variance_groups=false"],
    ),
    (
        "algorithm.dpo.beta",
        ["algorithm.dpo.beta=0.2"],
        [
            "run.mode=offline",
            "offline.path=d.jsonl",
            "offline.format=dpo",
            "algorithm.objective=dpo",
            "algorithm.dpo.beta=0.2",
        ],
    ),
    (
        "algorithm.sft_mix.mu_peak",
        ["algorithm.sft_mix.mu_peak=0.3"],
        ["algorithm.sft_mix.mu_peak=0.3", "algorithm.objective=sft_rl_mix", "offline.path=d.jsonl"],
    ),
    (
        "offline.batch_size",
        ["offline.batch_size=4"],
        ["offline.batch_size=4", "offline.warmup_steps=2", "offline.path=d.jsonl"],
    ),
    (
        "trainer.min_lr_ratio",
        ["trainer.min_lr_ratio=0.1"],
        ["trainer.min_lr_ratio=0.1", "trainer.lr_schedule=cosine"],
    ),
    (
        "trainer.share_group_prefix",
        ["trainer.share_prefix=false", "trainer.share_group_prefix=false"],
        ["trainer.share_group_prefix=false"],
    ),
    (
        "trainer.memory_budget_measured",
        ["trainer.memory_budget_measured=false"],
        ["trainer.memory_budget_measured=false", "trainer.memory_budget_gib=3"],
    ),
    (
        "trainer.ray.num_cpus",
        ["trainer.type=verl", "trainer.ray.num_cpus=4"],
        ["trainer.type=verl", "trainer.ray.num_cpus=4", "trainer.n_gpus_per_node=2"],
    ),
    (
        "engine.prefix_block_tokens",
        ["engine.prefix_caching=false", "engine.prefix_block_tokens=32"],
        ["engine.prefix_block_tokens=32"],
    ),
    (
        "engine.enforce_eager",
        [*VLLM, "engine.urls=[http://127.0.0.1:9]", "engine.enforce_eager=true"],
        [*VLLM, "engine.enforce_eager=true"],
    ),
    (
        "engine.tool_call_parser",
        [*VLLM, "engine.tool_call_parser=llama3_json"],
        [*VLLM, "engine.tool_call_parser=llama3_json", "engine.chat_rendering=vllm"],
    ),
    (
        "engine.reuse_prompt_tokens",
        [*VLLM, "engine.chat_rendering=vllm", "engine.reuse_prompt_tokens=false"],
        [*VLLM, "engine.reuse_prompt_tokens=false"],
    ),
    (
        "engine.max_loras",
        [*VLLM, "engine.max_loras=4"],
        [*VLLM, "engine.max_loras=4", "engine.enable_lora=true", "trainer.lora={rank: 8}"],
    ),
    (
        "monitor.wandb.project",
        ["monitor.wandb.project=x"],
        ["monitor.wandb.project=x", "monitor.wandb.enabled=true"],
    ),
    (
        "monitor.mlflow.experiment",
        ["monitor.mlflow.experiment=x"],
        ["monitor.mlflow.experiment=x", "monitor.mlflow.enabled=true"],
    ),
    (
        "monitor.console_metrics",
        ["monitor.console=false", "monitor.console_metrics=[loss]"],
        ["monitor.console_metrics=[loss]"],
    ),
    (
        "health.rules.kl.max",
        ["health.enabled=false", "health.rules.kl.max=2"],
        ["health.rules.kl.max=2"],
    ),
    (
        "health.rollback.lr_factor",
        ["health.rollback.lr_factor=0.3"],
        ["health.rollback.lr_factor=0.3", "health.rules.reward_collapse.action=rollback"],
    ),
    (
        "health.rules.entropy_collapse.fraction",
        ["health.rules.entropy_collapse.action=off", "health.rules.entropy_collapse.fraction=0.1"],
        ["health.rules.entropy_collapse.fraction=0.1"],
    ),
    (
        "data.operators.0.reward",
        ["data.operators=[{type: format, pattern: x, action: drop, reward: -1}]"],
        ["data.operators=[{type: format, pattern: x, reward: -1}]"],
    ),
    (
        "data.offline_operators.0.scope",
        [*OFFLINE_SFT, "data.offline_operators=[{type: dedup, scope: group}]"],
        [
            *OFFLINE_SFT,
            "data.offline_operators=[{type: dedup, threshold: 0.8}]",
            "data.operators=[]",
        ],
    ),
]


def keys(config: RunConfig) -> list[str]:
    return [item.key for item in no_effect(config)]


@pytest.mark.parametrize(("key", "idle", "acting"), CASES, ids=[c[0] for c in CASES])
def test_a_key_is_named_where_it_does_nothing_and_only_there(key, idle, acting):
    found = {item.key: item for item in no_effect(load_config(None, [*BASE, *idle]))}
    assert key in found, sorted(found)
    message = found[key].message
    assert message.startswith(f"config key {key} has no effect: ") and "\n" not in message
    assert "remove" in message or "set " in message  # what to do
    assert key not in keys(load_config(None, [*BASE, *acting]))


def test_defaults_and_keys_that_act_are_not_named():
    assert keys(load_config(None, BASE)) == []
    acting = [
        *BASE,
        "run.mode=async",
        "run.max_staleness=3",
        "trainer.lr=1e-5",
        "tasks.val=v.jsonl",
        "run.eval_every=2",
        "monitor.wandb={enabled: true, tags: [a]}",
    ]
    assert keys(load_config(None, acting)) == []


def test_keys_at_their_default_value_count_when_the_user_wrote_them(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nrun: {max_staleness: 2}\n")
    assert keys(load_config(path)) == ["run.max_staleness"]


def test_a_saved_config_names_only_what_its_user_set(tmp_path):
    """A resolved config lists every key (with `run.max_staleness: 2` in a sync run); a resumed
    run or a sweep's seed names the user's keys and its own `--set`s, not the defaults."""
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "workflow": "app.py:run",
                "tasks": {"train": "t.jsonl"},
                "explorer": {"reward_gamma": 0.9},
            }
        )
    )
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(load_config(path)))
    assert "max_staleness: 2" in saved.read_text()
    assert keys(load_config(saved)) == ["explorer.reward_gamma"]
    resumed = load_config(saved, ["monitor.mlflow.experiment=x", "run.steps=40"])
    assert keys(resumed) == ["explorer.reward_gamma", "monitor.mlflow.experiment"]
    assert "run.steps" in (resumed.user_keys or ())
    saved.write_text(dump_config(resumed))  # saved again: the resumed run's keys stay
    assert keys(load_config(saved)) == ["explorer.reward_gamma", "monitor.mlflow.experiment"]


def test_a_sweep_seed_adds_no_key_of_its_own(tmp_path):
    """The `--set`s a sweep gives each seed (its folder, name, seeds) all act, offline too."""
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "run": {"mode": "offline"},
                "offline": {"path": "d.jsonl"},
                "algorithm": {"objective": "sft"},
            }
        )
    )
    config = load_config(path)
    (tmp_path / "config.yaml").write_text(dump_config(config))
    data = {
        "config": config.model_dump(mode="json"),
        "runs": {"1": "seed-1"},
        "follow": ["run.seed", "explorer.seed", "engine.seed"],
    }
    command = seed_command(tmp_path, data, 1, "INFO")
    sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    assert keys(load_config(tmp_path / "config.yaml", sets)) == []


def test_warnings_are_logged_one_line_per_key(caplog):
    config = load_config(None, [*BASE, "run.max_staleness=4", "explorer.reward_gamma=0.5"])
    with caplog.at_level(logging.WARNING, logger="agentscope_rft.config_effect"):
        found = warn_no_effect(config)
    assert [r.getMessage() for r in caplog.records] == [item.message for item in found]
    assert len(found) == 2


def test_train_says_so_before_anything_runs(tmp_path):
    """`train` logs the lines at preflight, before it fails on the missing workflow file."""
    config = tmp_path / "run.yaml"
    config.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nrun: {max_staleness: 4}\n")
    env = {**os.environ, "COLUMNS": "1000"}
    proc = subprocess.run(
        [sys.executable, "-m", "agentscope_rft.cli", "train", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 2, out
    assert "config key run.max_staleness has no effect: run.mode is 'sync'" in out
    assert "app.py" in out  # and then the real error


EXAMPLES = [  # configs to start from; results/ and artefacts/ hold saved runs' configs
    p
    for p in sorted(Path("examples").glob("**/config*.yaml"))
    if not {"results", "artefacts"} & set(p.parts)
]


@pytest.mark.parametrize("config", EXAMPLES, ids=str)
def test_the_examples_set_no_key_that_does_nothing(config):
    assert [item.message for item in no_effect(load_config(config))] == []


def test_doctor_checks_a_config(tmp_path):
    from typer.testing import CliRunner

    from agentscope_rft.cli import app

    config = tmp_path / "run.yaml"
    config.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nrun: {max_staleness: 4}\n")
    result = CliRunner().invoke(app, ["doctor", "--config", str(config), "--set", "run.steps=3"])
    assert result.exit_code == 0, result.output
    lines = " ".join(result.output.split())
    assert "[doctor] warning: config key run.max_staleness has no effect" in lines
    assert "valid; 1 key(s) with no effect" in lines
    config.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nrun: {stepz: 4}\n")
    result = CliRunner().invoke(app, ["doctor", "--config", str(config)])
    assert result.exit_code == 2 and "did you mean 'steps'" in result.output


def test_an_exported_config_keeps_the_users_keys(tmp_path):
    """A sweep's artefacts carry the run configs with relative paths, and the user's key list."""
    from agentscope_rft.runtime.artefacts import _write_portable_config

    (tmp_path / "ex").mkdir()
    path = tmp_path / "ex" / "run.yaml"
    path.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nrun: {max_staleness: 4}\n")
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(load_config(path)))
    exported = tmp_path / "ex" / "results" / "config.yaml"
    exported.parent.mkdir()
    _write_portable_config(saved, exported, tmp_path)
    assert "workflow: ../app.py:run" in exported.read_text()
    assert keys(load_config(exported)) == ["run.max_staleness"]


def test_a_config_saved_before_the_key_list_names_keys_set_off_their_default(tmp_path):
    """Run folders written before the first line named the user's keys list every key: there,
    the keys whose value is not the default are the user's (and `--set`s on resume)."""
    config = load_config(
        None, [*BASE, "explorer.reward_gamma=0.9", "tasks.val=v.jsonl", "run.eval_every=2"]
    )
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config).partition("\n")[2])  # no first line
    assert "max_staleness: 2" in saved.read_text() and "# keys" not in saved.read_text()
    assert keys(load_config(saved)) == ["explorer.reward_gamma"]
    assert keys(load_config(saved, ["run.max_staleness=2"])) == [
        "explorer.reward_gamma",
        "run.max_staleness",
    ]
    examples = sorted(Path("examples").glob("*/results/**/config.yaml"))[:3]
    for old in examples:  # saved by earlier versions, loading with their own idle keys only
        assert all(item.key != "run.max_staleness" for item in no_effect(load_config(old)))
