"""Configs as a new user writes them, broken: each problem is one line naming the file, the line
and the key, and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentscope_rft.config import ConfigError, load_config

GOOD = "workflow: app.py:run\ntasks: {train: t.jsonl}\n"


def error_of(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        (  # an unclosed flow mapping: PyYAML's five lines become one
            GOOD + "run: {steps: 3\nexplorer: {group_size: 2}\n",
            ["is not valid YAML: line 4, column 9", "from line 3", "close each {"],
        ),
        (
            "workflow: app.py:run\ntasks:\n\ttrain: t.jsonl\n",
            ["line 3, column 1", "not allow tabs"],
        ),
        (
            "workflow: app.py:run\ntasks:\n  train: t.jsonl\n    val: v.jsonl\n",
            ["line 4", "indented under its section"],
        ),
        ("", ["is empty (or only comments)", "workflow: app.py:run"]),
        ("# just a comment\n", ["is empty (or only comments)"]),
        ("- workflow: app.py:run\n", ["is a list", "remove the leading '- '"]),
        ("hello\n", ["holds 'hello'", "mapping of sections"]),
        (
            GOOD + "run: {steps: 3}\nrun: {seed: 1}\n",
            ["line 4: key 'run' is given twice", "first at line 3", "merge them"],
        ),
        (GOOD + "trainer:\n  lr: 1.0e-5\n  lr: 2.0e-5\n", ["line 5: key 'trainer.lr' is given"]),
        (
            GOOD + "run: {steps: many}\n",
            ["run.steps: Input should be a valid integer", "(got 'many'; line 3)"],
        ),
        (GOOD + "run: {mode: asynch}\n", ["run.mode: Input should be 'sync'", "got 'asynch'"]),
        (
            GOOD + "run: 20\n",
            ["run: is a section: write its keys under it (e.g. `run: {", "got 20; line 3"],
        ),
        (
            GOOD + "steps: 20\n",
            ["(top level): unknown key 'steps'; it belongs in run.steps", "line 3"],
        ),
        (
            GOOD + "trainer:\n  lora: {rank: 8}\n  steps: 4\n",
            ["trainer: unknown key 'steps'; it belongs in run.steps (line 5)"],
        ),
        (GOOD + "trainer: {lrr: 1.0e-5}\n", ["trainer: unknown key 'lrr'; did you mean 'lr'?"]),
        (GOOD + "engine: {type: vllm, dtyp: auto}\n", ["engine: unknown", "did you mean 'dtype'"]),
        (
            GOOD + "engine: {type: vllm, device: cpu}\n",
            [
                "engine: unknown key 'device'; 'device' is a key of engine type 'embedded': set "
                "`type: embedded` to use it (line 3)"
            ],
        ),
        (
            GOOD + "explorer: {group_size: 4, temperature: 0.7}\n",
            [
                "explorer: unknown key 'temperature'; it belongs in explorer.sampling.temperature "
                "or explorer.eval_sampling.temperature (line 3)"
            ],
        ),
        (
            GOOD + "trainer: {n_gpus_per_node: 2}\n",
            ["'n_gpus_per_node' is a key of trainer type 'verl': set `type: verl`"],
        ),
        (
            GOOD + "algorithm: {advantage: {type: grpo, clip: 1}}\n",
            ["unknown GRPOConfig key 'clip' (known keys: epsilon, normalize_std, type) (line 3)"],
        ),
        (
            "workflow: app.py:run\ntasks: t.jsonl\n",
            ["tasks: is a section: write its keys under it (e.g. `tasks: {train: t.jsonl}`)"],
        ),
    ],
)
def test_a_broken_file_is_one_line_naming_where_and_the_fix(tmp_path, text, parts):
    message = error_of(tmp_path, text)
    assert "\n" not in message and "<unicode string>" not in message, message
    assert "run.yaml" in message
    for part in parts:
        assert part in message, message


def test_union_tags_are_not_shown_as_keys(tmp_path):
    message = error_of(tmp_path, GOOD + "trainer: {steps: 4}\n")
    assert message.startswith("invalid config") and "trainer.torch" not in message


def test_several_problems_are_one_line_each(tmp_path):
    message = error_of(tmp_path, GOOD + "run: {steps: many}\nexplorer: {group_size: 2.5}\n")
    lines = message.splitlines()
    assert lines[0] == f"invalid config {tmp_path / 'run.yaml'}:"
    assert lines[1].startswith("  explorer.group_size: ") and "line 4" in lines[1]
    assert lines[2].startswith("  run.steps: ") and "line 3" in lines[2]


def test_a_value_from_set_says_so_not_a_file_line(tmp_path):
    message = error_of(tmp_path, GOOD + "run: {steps: 3}\n", ("run.steps=abc",))
    assert message.endswith("(got 'abc'; --set)")


def test_a_typo_from_set_is_not_blamed_on_the_file(tmp_path):
    message = error_of(tmp_path, GOOD + "trainer: {lr: 1.0e-5}\n", ("trainer.lrr=1",))
    assert "unknown key 'lrr'; did you mean 'lr'?" in message and message.endswith("(--set)")
    message = error_of(tmp_path, GOOD + "trainer: {lr: 1.0e-5, lrr: 1}\n", ("run.steps=2",))
    assert message.endswith("(line 3)")


def test_a_sections_own_check_names_the_keys_set_gave(tmp_path):
    # The section's check reads several keys: it was blamed on the file's line alone.
    text = GOOD + "explorer:\n  agents: {helpers: []}\n"
    message = error_of(tmp_path, text, ("explorer.agents.skip=[solver/router]",))
    assert message.endswith("(line 4; --set explorer.agents.skip)")


def test_an_empty_file_with_sets_is_the_sets(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("")
    assert load_config(path, ["workflow=app.py:run", "tasks.train=t.jsonl"]).workflow


def test_set_reaches_into_lists_by_position(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(GOOD + "data:\n  operators: [{type: reward_range, min: 0}, {type: length}]\n")
    config = load_config(path, ["data.operators.0.min=0.5", "data.operators.1.max_tokens=64"])
    first, second = config.data.operators
    assert (first.min, second.max_tokens) == (0.5, 64)
    with pytest.raises(ConfigError, match=r"data\.operators is a list with positions 0 to 1, so "):
        load_config(path, ["data.operators.2.min=0.5"])
    with pytest.raises(ConfigError, match=r"run\.steps is 3, not a section"):
        load_config(path, ["run.steps=3", "run.steps.x=1"])


def test_paths_expand_the_home_folder_and_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    path = tmp_path / "run.yaml"
    path.write_text(
        "workflow: ${DATA_DIR}/app.py:run\ntasks: {train: $DATA_DIR/t.jsonl, val: ~/v.jsonl}\n"
    )
    config = load_config(path)
    assert config.workflow == f"{tmp_path}/data/app.py:run"
    assert (config.tasks.train, config.tasks.val) == (
        f"{tmp_path}/data/t.jsonl",
        f"{tmp_path}/home/v.jsonl",
    )
    monkeypatch.delenv("DATA_DIR")
    message = r"run\.yaml: workflow: '\$\{DATA_DIR\}/app\.py' names the environment variable "
    with pytest.raises(ConfigError, match=message + r"\$DATA_DIR, which is not set: export"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^tasks\.train: '\$NOPE/t\.jsonl' names the"):
        load_config(None, ["workflow=app.py:run", "tasks.train=$NOPE/t.jsonl"])


def test_libyaml_reads_a_config_as_pyyaml_does(tmp_path, monkeypatch):
    """Configs are parsed once, with libyaml where PyYAML has it (they were parsed twice in pure
    Python, ~30 ms a file); the data and the key lines are the same, and a broken file still gets
    PyYAML's own message."""
    import yaml

    from agentscope_rft import config_errors

    assert config_errors._FAST_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    file = tmp_path / "run.yaml"
    file.write_text(
        "base: &b {lr: 1.0e-5, on: yes}\n"
        "trainer:\n  <<: *b\n  note: |\n    two\n    lines\n"
        "run:\n  steps: 3\n  when: 2026-11-30\n  tags: [a, 'b: c']\n"
    )
    fast = config_errors.read_config_file(file)
    monkeypatch.setattr(config_errors, "_FAST_LOADER", yaml.SafeLoader)
    assert fast == config_errors.read_config_file(file)
    assert fast[1][("run", "steps")] == 8

    monkeypatch.undo()
    file.write_text("run:\n\tsteps: 3\n")
    with pytest.raises(ConfigError, match="indent with spaces"):
        config_errors.read_config_file(file)


def test_a_fractional_vllm_kv_cache_names_the_whole_gib_to_use(tmp_path):
    # vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer: 0.5 passed the config and killed the server.
    message = error_of(tmp_path, GOOD + "engine: {type: vllm, kv_cache_space_gib: 0.5}\n")
    assert "whole GiB" in message and message.endswith("use 1 (got 0.5; line 3)")
    path = tmp_path / "run.yaml"
    path.write_text(GOOD + "engine: {type: vllm, kv_cache_space_gib: 2.0}\n")
    assert load_config(path).engine.kv_cache_space_gib == 2
