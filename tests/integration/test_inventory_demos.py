"""The inventory example's demonstrations: the script wins through the unchanged app, the
recorded prompts are the ones the policy is shown (runtime state dropped), and the committed file
holds training questions only."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

from agentscope_rft.api import import_file
from agentscope_rft.buffer.offline import load_sft_samples
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.models import load_tokenizer, resolve_model

HERE = Path(__file__).resolve().parents[2] / "examples" / "inventory"


def ids(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [json.loads(line).get("task_id") or json.loads(line)["id"] for line in lines]


async def test_the_script_wins_every_episode_it_plays_through_the_app(tmp_path) -> None:
    make = import_file(HERE / "make_demos.py")
    out = tmp_path / "demos.jsonl"
    args = Namespace(config=str(HERE / "config.yaml"), out=str(out), limit=6, concurrency=3)
    summary = await make.main(args)
    assert (summary["tasks"], summary["won"], summary["conversations"]) == (6, 6, 6)
    assert summary["failed"] == 0 and summary["calls_per_demo"] == 2.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    answers = {t["task_id"]: t for t in map(json.loads, (HERE / "tasks_train.jsonl").open())}
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert row["messages"][3]["content"] == str(answers[row["id"]]["answer"])
        text = json.dumps(row)
        assert "system-reminder" not in text  # the config's gateway.runtime_state: drop
        assert [t["function"]["name"] for t in row["tools"]] == ["check_stock"]


def test_the_committed_demonstrations_are_training_questions_that_load() -> None:
    demos = ids("demos.jsonl")
    assert len(demos) == 32 and len(set(demos)) == 32
    assert set(demos) <= set(ids("tasks_train.jsonl"))
    assert not set(demos) & (set(ids("tasks_val.jsonl")) | set(ids("tasks_test.jsonl")))
    renderer = ChatRenderer(load_tokenizer(resolve_model("tiny-random")))
    samples = load_sft_samples(HERE / "demos.jsonl", renderer)
    assert len(samples) == 32
    for sample in samples:  # the tool call and the answer train; the prompt and result do not
        assert 0 < sum(sample.loss_mask) < len(sample.loss_mask)
