"""`explorer.agents`: which agents train, validated where the config loads."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.explorer.agents import AgentsConfig, UnseenAgentWarning
from agentscope_rft.runtime.no_samples import why_no_samples
from tests.unit.test_config import MINIMAL


def test_the_selection_loads_from_yaml_overrides():
    config = load_config(None, [*MINIMAL, "explorer.agents={skip: [critic]}"])
    assert config.explorer.agents.skip == ["critic"]
    assert not config.explorer.agents.trains("critic")
    assert config.explorer.agents.trains("solver") and config.explorer.agents.trains(None)
    one = load_config(None, [*MINIMAL, "explorer.agents.skip=critic"])  # one name, no list
    assert one.explorer.agents.skip == ["critic"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{train: []}", "explorer.agents.train is empty, so no agent would train"),
        ("{train: [a], skip: [b]}", "give explorer.agents.train or explorer.agents.skip"),
        ("{skip: [solver/compress]}", "name the agent ('solver') and add 'compress' to helpers"),
        ("{compression: false}", "remove `compression: false` (no helper call trains by default)"),
        ("{helpers: [judge]}", "unknown kind of helper call 'judge' (known: compress, memory"),
        ("{trian: [a]}", "did you mean 'train'"),
    ],
)
def test_a_bad_selection_says_what_is_wrong(value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [*MINIMAL, f"explorer.agents={value}"])


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (AgentsConfig(), {"solver": True, "critic": True, "solver/compress": False, None: True}),
        (
            AgentsConfig(train=["solver"], helpers=["compress"]),
            {"solver": True, "critic": False, "solver/compress": True, "critic/compress": False},
        ),
        (AgentsConfig(train=["-"]), {None: True, "solver": False}),
        (AgentsConfig(skip=["critic"]), {"critic": False, "critic/compress": False}),
    ],
)
def test_which_calls_train(selection, expected):
    assert {name: selection.trains(name) for name in expected} == expected


def test_a_name_no_agent_has_warns_once_with_the_close_one(caplog):
    warning = UnseenAgentWarning(AgentsConfig(train=["Solver"]))
    with caplog.at_level(logging.WARNING):
        warning.check(["solver", "critic", "solver/compress"])
        warning.check(["solver"])
    [record] = [r for r in caplog.records if "explorer.agents names" in r.message]
    message = record.getMessage()
    assert "'Solver' (did you mean 'solver'?)" in message
    assert "agents seen: critic, solver; NONE of them trains" in message


def test_a_step_left_empty_by_the_selection_says_so():
    metrics = {"trajectory/samples": 0.0, "trajectory/untrained_calls": 8.0}
    cause = why_no_samples(metrics, Path("runs/x/rollouts.jsonl"))
    assert cause.startswith("no agent that made calls trains (explorer.agents): 8 call(s)")
    assert why_no_samples({}, Path("r.jsonl")).startswith("every episode failed")
