"""Write the inventory agent's demonstrations: a script that plays the app with the right calls.

The documented first signal for a model that never calls the tool on its own
(docs/workflows.md, "A first signal on a small model"): `agentscope_rft.demos.record_demos` plays
the unchanged app (`app.py`, its `Agent`, its tool, the real gateway with the config's
`gateway.runtime_state`) with this script as the model. The script reads the item and warehouse
the question names, calls `check_stock` with them, and answers with the number the tool returned.
Every episode the app scores 1.0 becomes one chat-JSONL line (`{"messages", "tools"}`): the
conversation exactly as the agent showed it to the model.

    python examples/inventory/make_demos.py              # -> examples/inventory/demos.jsonl
    python examples/inventory/make_demos.py --limit 40 --out d.jsonl

Only training questions are played (`tasks.train` of `--config`): the validation and test items
never appear in the demonstrations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from agentscope_rft.config import load_config  # noqa: E402
from agentscope_rft.demos import Reply, episode_turns, record_demos  # noqa: E402
from agentscope_rft.explorer.tasks import load_tasks  # noqa: E402


def scripted_reply(tasks: Iterable[Mapping[str, Any]]) -> Reply:
    """The script: the episode's question (its last user turn that is one of `tasks`') gets a
    `check_stock` call with the item and warehouse it names; the tool's result gets the answer
    sentence of the system prompt's worked example. A question it does not know gets a refusal
    (that episode scores 0 and is not kept)."""
    by_question = {str(task["question"]).strip(): task for task in tasks}

    def reply(messages: list[dict[str, Any]], tools: Any = None) -> str:
        found = episode_turns(messages, by_question)
        if found is None:
            return "I do not know."
        task, results = found
        if not results:
            call = {
                "name": "check_stock",
                "arguments": {"item": task["item"], "warehouse": task["warehouse"]},
            }
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return (
            f"There are {results[-1].strip()} {task['item']} in stock at the "
            f"{task['warehouse']} warehouse."
        )

    return reply


async def main(args: argparse.Namespace) -> dict[str, Any]:
    config = load_config(args.config)
    assert config.tasks.train is not None and config.workflow is not None
    tasks = load_tasks(config.tasks.train, id_field=config.tasks.id_field)
    if args.limit:
        tasks = tasks[: args.limit]
    return await record_demos(
        config.workflow,
        tasks,
        scripted_reply(t.data for t in tasks),
        args.out,
        concurrency=args.concurrency,
        runtime_state=config.gateway.runtime_state,  # the prompts the policy will be shown
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(HERE / "config.yaml"), help="its training tasks")
    parser.add_argument("--out", default=str(HERE / "demos.jsonl"))
    parser.add_argument("--limit", type=int, default=0, help="the first N questions (0: all)")
    parser.add_argument("--concurrency", type=int, default=8)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
