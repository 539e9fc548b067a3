"""The run config: short YAML, did-you-mean errors, overrides, and a current reference doc."""

from pathlib import Path

import pytest

from agentscope_rft.config import ConfigError, RunConfig, Section, dump_config, load_config
from agentscope_rft.config_reference import reference

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ["workflow=app.py:run", "tasks.train=tasks.jsonl"]


def test_short_yaml_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "workflow: app.py:run\ntasks: {train: t.jsonl}\nengine: vllm\n"
        "algorithm: {advantage: rloo}\n"
    )
    config = load_config(
        path, ["trainer.lr=3e-5", "explorer.sampling.temperature=0.7", "engine.enforce_eager=true"]
    )
    assert config.engine.type == "vllm" and config.engine.enforce_eager
    assert config.trainer.lr == 3e-5 and config.explorer.sampling.temperature == 0.7
    assert config.algorithm.advantage.type == "rloo"
    assert config.run.name == "run"  # from the file name


def test_resolved_config_round_trips(tmp_path):
    config = load_config(None, [*MINIMAL, "buffer.type=sql", "trainer.lora.rank=8", "run.name=x"])
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config))
    assert load_config(saved) == config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.lrr=1", "unknown key 'lrr'; did you mean 'lr'"),
        (
            "explorer.group_size=0",
            "explorer.group_size: Input should be greater than or equal to 1",
        ),
        ("engine.type=tpu", "engine"),
        ("run.mode=offline", "set `offline.path`"),
        ("algorithm.objective=dpo", "run.mode 'sync' does not explore (its episodes have no"),
        ("algorithm.advantage=grpoo", "grpo"),
        ("bogus", "use key.path=value"),
        ("explorer.sampling={max_tokens: 4", "the value is not valid YAML"),
        ("run.name=..", "run.name '..' must name a folder inside runs/"),
        ("run.name=/abs", "run.name '/abs' must name a folder inside runs/"),
        ("run.name=.", "run.name '.' must name a folder inside runs/"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [*MINIMAL, override])


def test_a_config_folder_is_not_called_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"is a folder, not a YAML file"):
        load_config(tmp_path)


def test_a_config_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"workflow: app.py:run\nrun: {name: \xff\xfe}\n")
    with pytest.raises(ConfigError, match=r"run\.yaml is not UTF-8 text .*save it as UTF-8"):
        load_config(path)


def _sections(model: type) -> set[type]:
    found = {model}
    for field in model.model_fields.values():
        for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            if isinstance(arg, type) and issubclass(arg, Section):
                found |= _sections(arg)
    return found


def test_every_key_is_documented():
    undocumented = [
        f"{model.__name__}.{name}"
        for model in _sections(RunConfig)
        for name, field in model.model_fields.items()
        if not field.description
        and not (isinstance(field.annotation, type) and issubclass(field.annotation, Section))
        and name != "type"
    ]
    assert undocumented == []


def test_reference_doc_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == reference(), (
        "docs/config.md is stale: run `python -m agentscope_rft.config_reference`"
    )


def _project(folder: Path) -> Path:
    """A config next to its workflow, tasks and template, as a user lays out an experiment."""
    folder.mkdir(parents=True)
    (folder / "app.py").write_text("async def run(task, model):\n    return 1.0\n")
    (folder / "tasks.jsonl").write_text('{"id": "a"}\n')
    (folder / "template.jinja").write_text("{{ messages }}")
    (folder / "judges").mkdir()
    (folder / "judges" / "judge.py").write_text("async def judge(task, response):\n    return 1\n")
    config = folder / "run.yaml"
    config.write_text(
        "workflow: app.py:run\njudge: judges/judge.py:judge\n"
        "tasks: {train: tasks.jsonl, eval: ./tasks.jsonl}\n"
        "model: {chat_template: template.jinja}\n"
    )
    return config


def test_file_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    config_file = _project(tmp_path / "exp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(config_file)
    exp = (tmp_path / "exp").resolve()
    assert config.workflow == f"{exp / 'app.py'}:run"
    assert config.judge == f"{exp / 'judges' / 'judge.py'}:judge"
    assert config.tasks.train == config.tasks.eval == str(exp / "tasks.jsonl")
    assert config.model.chat_template == str(exp / "template.jinja")
    assert config.model.name_or_path == "smollm2-135m-instruct"  # a name, not a path
    # The run folder's copy keeps them absolute: a resumed run finds them from anywhere.
    saved = tmp_path / "run" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text(dump_config(config))
    assert load_config(saved) == config


def test_absolute_paths_module_specs_and_inline_templates_are_kept(tmp_path, monkeypatch):
    config_file = _project(tmp_path / "exp")
    app = (tmp_path / "exp" / "app.py").resolve()
    config_file.write_text(
        f"workflow: {app}:run\njudge: my_pkg.judges:judge\n"
        f"tasks: {{train: {app.parent}/tasks.jsonl}}\n"
        "model: {chat_template: '{{ messages }}'}\n"
    )
    monkeypatch.chdir(tmp_path)
    config = load_config(config_file)
    assert config.workflow == f"{app}:run"
    assert config.judge == "my_pkg.judges:judge"
    assert config.tasks.train == str(app.parent / "tasks.jsonl")
    assert config.model.chat_template == "{{ messages }}"


def test_set_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    config_file = _project(tmp_path / "exp")
    (tmp_path / "other.jsonl").write_text('{"id": "b"}\n')
    monkeypatch.chdir(tmp_path)
    config = load_config(config_file, ["tasks.train=other.jsonl"])
    assert config.tasks.train == str((tmp_path / "other.jsonl").resolve())


def test_a_path_only_found_from_the_working_directory_still_works_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "app.py").write_text("async def run(task, model):\n    return 1.0\n")
    (tmp_path / "exp" / "t.jsonl").write_text('{"id": "a"}\n')
    config_file = tmp_path / "exp" / "run.yaml"
    config_file.write_text("workflow: exp/app.py:run\ntasks: {train: exp/t.jsonl}\n")
    monkeypatch.chdir(tmp_path)
    config = load_config(config_file)
    assert config.workflow == f"{(tmp_path / 'exp' / 'app.py').resolve()}:run"
    assert "relative to its folder" in caplog.text


@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_quickstart_config_loads_from_the_repo_root_and_elsewhere(cwd, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT if cwd == "root" else tmp_path)
    config = load_config(ROOT / "examples" / "quickstart" / "config.yaml")
    quickstart = ROOT / "examples" / "quickstart"
    assert config.workflow == f"{quickstart / 'app.py'}:run"
    for path in (config.tasks.train, config.tasks.eval):
        assert path is not None and Path(path).is_file() and Path(path).parent == quickstart
    from agentscope_rft.api import load_workflow

    assert load_workflow(config.workflow).name == "run"


def test_the_removed_sync_section_loads_from_saved_configs_and_is_refused_with_a_value(tmp_path):
    """`sync.method` did nothing: a saved config's `sync: {method: auto}` still loads (and is
    not saved again); any other value names where the choice lives now."""
    base = {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}}
    saved = RunConfig.model_validate({**base, "sync": {"method": "auto"}})
    assert "\nsync:" not in dump_config(saved)
    with pytest.raises(ValueError, match=r"sync .* was removed .*engine.weight_transfer: nccl"):
        RunConfig.model_validate({**base, "sync": {"method": "checkpoint"}})
    path = tmp_path / "run.yaml"
    path.write_text("workflow: app.py:run\ntasks: {train: t.jsonl}\nsync: {method: lora}\n")
    with pytest.raises(ConfigError, match=r"engine\.enable_lora"):
        load_config(path)
    assert load_config(path, ["sync=null"]).run.name == "run"  # a resumed run's way out


def test_evaluation_stays_greedy_when_only_its_length_is_given(tmp_path):
    """`eval_sampling: {max_tokens: 8}` (or `--set explorer.eval_sampling.max_tokens=8`) made
    validation and test episodes sample at temperature 1.0: the section's default was greedy only
    while the whole section was left out."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "workflow: app.py:run\ntasks: {train: t.jsonl}\n"
        "explorer: {sampling: {max_tokens: 8}, eval_sampling: {max_tokens: 8}}\n"
    )
    from_yaml = load_config(path).explorer
    from_set = load_config(path, ["explorer.eval_sampling.top_p=0.9"]).explorer.eval_sampling
    assert (from_yaml.eval_sampling.temperature, from_yaml.eval_sampling.max_tokens) == (0.0, 8)
    assert (from_set.temperature, from_set.top_p) == (0.0, 0.9)
    assert from_yaml.sampling.temperature == 1.0  # training samples, as before
    given = load_config(path, ["explorer.eval_sampling.temperature=0.7"]).explorer.eval_sampling
    assert given.temperature == 0.7
