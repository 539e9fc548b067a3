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
        ("algorithm.advantage=grpoo", "grpo"),
        ("bogus", "use key.path=value"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(None, [*MINIMAL, override])


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
