"""The web-search demonstrations: the scripted oracle wins the counted question types through the
real app, and its conversations train the tokens the agent would produce, in the example's
chat template."""

from __future__ import annotations

import json
from pathlib import Path

from agentscope_rft.api import import_file
from agentscope_rft.buffer.offline import load_sft_samples
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.config import load_config
from agentscope_rft.demos import conversations, play, record_demos
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model
from workflows.search_scripted import oracle_reply

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "web_search"


def _train_tasks(types: tuple[str, ...], per_type: int) -> list:
    config = load_config(EXAMPLE / "config.yaml")
    assert config.tasks.train is not None
    tasks = load_tasks(config.tasks.train)
    return [t for kind in types for t in [t for t in tasks if t.data["type"] == kind][:per_type]]


async def test_the_oracle_wins_counted_questions_and_writes_them(tmp_path: Path) -> None:
    tasks = _train_tasks(("single_hop", "two_hop", "comparison"), 3)
    reply = oracle_reply(t.data for t in tasks)
    out = tmp_path / "demos.jsonl"
    summary = await record_demos(f"{EXAMPLE}/app.py:run", tasks, reply, out, max_tokens=40)
    assert summary["won"] == summary["conversations"] == 9, summary
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["id"] for r in rows} == {t.id for t in tasks}
    for row in rows:
        assert [t["function"]["name"] for t in row["tools"]] == ["search"]
        assert row["messages"][-1]["content"].startswith("<answer>")
    # a question it was not given is given up, not guessed
    assert "unknown" in reply([{"role": "user", "content": "Who wrote Hamlet?"}])


async def test_demonstrations_train_exactly_the_tokens_the_agent_produces(tmp_path: Path) -> None:
    # The oracle's episode, written as a demonstration and read back as an SFT sample, is token
    # for token the sample the gateway recorded (one template for both: the scripted engine's),
    # with the episode's turns trained as recorded.
    tasks = _train_tasks(("two_hop",), 1)
    reply = oracle_reply(t.data for t in tasks)
    app = import_file(EXAMPLE / "app.py")
    [rollout], calls = await play(app.run, tasks, reply, max_tokens=40)
    assert rollout.success
    [(messages, tools)] = conversations(calls[rollout.rollout_id], reply)
    file = tmp_path / "demo.jsonl"
    file.write_text(json.dumps({"messages": messages, "tools": tools}) + "\n")
    [demo] = load_sft_samples(file, ChatRenderer(load_tokenizer(resolve_model(TINY_MODEL))))
    [recorded], _ = build_samples(rollout)
    n = len(recorded.token_ids)
    assert list(demo.token_ids[:n]) == list(recorded.token_ids)
    # SFT trains every assistant turn: the worked examples' in memory too, besides the episode's
    assert all(d >= r for d, r in zip(demo.loss_mask[:n], recorded.loss_mask, strict=True))
    assert not any(demo.loss_mask[n:])
