"""Write the web-search example's demonstrations: the scripted oracle playing training questions.

The oracle (`workflows/search_scripted.py`) plays each question's solution as tool calls through
the real app (`examples/web_search/app.py` and its settings, the real gateway and encyclopedia;
only the model is replaced by the script). Every question it answers becomes one chat-JSONL line
(`{"messages", "tools"}`): the exact conversation the agent had, the oracle's calls and answer as
the assistant turns. A config trains on them first with `offline.warmup_steps`.

    python examples/web_search/make_demos.py     # -> examples/web_search/data/demos.jsonl
    python examples/web_search/make_demos.py --types single_hop,two_hop --limit 200 --out d.jsonl

Only training questions are played (`tasks.train` of `--config`, whose app and token cap
`explorer.sampling.max_tokens` are used too): no validation or test question,
entity or fact appears in the demonstrations (the splits are disjoint, README "Splits").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from rich.progress import Progress  # noqa: E402

from agentscope_rft.config import load_config  # noqa: E402
from agentscope_rft.demos import record_demos  # noqa: E402
from agentscope_rft.explorer.tasks import load_tasks  # noqa: E402
from workflows.search_scripted import oracle_reply  # noqa: E402

COUNTED = "single_hop,two_hop"
"""The types a learning claim counts (README "Floors"): the ones the demonstrations teach."""


async def main(args: argparse.Namespace) -> dict:
    types = set(args.types.split(","))
    try:
        config = load_config(args.config)
        assert config.tasks.train is not None and config.workflow is not None
        tasks = [t for t in load_tasks(config.tasks.train) if t.data.get("type") in types]
    except ValueError as error:  # a missing or invalid config, a missing or broken task file
        raise SystemExit(f"error: {error}") from None
    if not tasks:
        raise SystemExit(f"error: {config.tasks.train} has no questions of types {sorted(types)}")
    random.Random(args.seed).shuffle(tasks)
    if args.limit:
        tasks = tasks[: args.limit]
    reply = oracle_reply(t.data for t in tasks)
    with Progress() as progress:
        bar = progress.add_task("oracle: playing questions", total=len(tasks))
        summary = await record_demos(
            config.workflow,
            tasks,
            reply,
            args.out,
            concurrency=args.concurrency,
            max_tokens=config.explorer.sampling.max_tokens,  # a reply the policy could write
            progress=lambda done, total: progress.update(bar, completed=done),
        )
    summary["types"] = sorted(types)
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(HERE / "config.yaml"), help="its training tasks")
    parser.add_argument("--out", default=str(HERE / "data/demos.jsonl"))
    parser.add_argument("--types", default=COUNTED, help="question types to play (comma list)")
    parser.add_argument("--limit", type=int, default=0, help="at most N questions (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="which questions --limit keeps")
    parser.add_argument("--concurrency", type=int, default=8)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
