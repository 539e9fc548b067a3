"""Write the ALFWorld example's demonstrations: the scripted searcher playing the training games.

The searcher (`workflows/alfworld_scripted.py`) plays each training game through the real app
(`examples/alfworld/app.py`, the real gateway and game engine; only the model is replaced by the
script), and every game it wins becomes one chat-JSONL line: the exact conversation the agent had
with the model, the searcher's commands as the assistant turns. The CPU config trains on these
first (`offline.warmup_steps`), then explores.

    python examples/alfworld/make_demos.py     # -> examples/alfworld/data/demos.jsonl
    python examples/alfworld/make_demos.py --tasks games.jsonl --out demos.jsonl --workflow run

Only training games are played: the held-out games never appear in the demonstrations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.progress import Progress  # noqa: E402

from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer  # noqa: E402
from agentscope_rft.explorer.tasks import load_tasks  # noqa: E402
from agentscope_rft.gateway.server import Gateway  # noqa: E402


def conversations(requests: list[Any], reply: Any) -> list[list[dict[str, Any]]]:
    """The distinct conversations of one episode's calls, each ending with the player's reply.

    Full history: every call extends the one before, so the episode is one conversation (its last
    call plus the reply). A sliding window starts a fresh prompt each turn: each call is its own.
    """
    out: list[list[dict[str, Any]]] = []
    for i, request in enumerate(requests):
        messages = [
            *request.messages,
            {"role": "assistant", "content": reply(request.messages, request.tools)},
        ]
        following = requests[i + 1].messages if i + 1 < len(requests) else None
        if (
            following is not None
            and len(following) > len(request.messages)
            and following[: len(request.messages)] == request.messages
        ):
            continue  # the next call carries this turn
        out.append(messages)
    return out


async def make_demos(args: argparse.Namespace) -> dict[str, Any]:
    from agentscope_rft.api import load_workflow
    from agentscope_rft.testing import ScriptedEngine
    from workflows.alfworld_scripted import searcher_reply

    workflow = load_workflow(f"{ROOT}/examples/alfworld/app.py:{args.workflow}")
    tasks = load_tasks(args.tasks)
    if args.limit:
        tasks = tasks[: args.limit]
    engine = ScriptedEngine(searcher_reply)
    await engine.start()
    started = time.perf_counter()
    greedy = {"": {"temperature": 0.0, "max_tokens": 16}}
    try:
        async with Gateway(engine, sampling_overrides=greedy) as gateway:
            settings = EpisodeSettings(
                max_concurrency=args.concurrency, max_retries=0, episode_timeout=3600
            )
            explorer = Explorer(workflow, gateway, settings)
            with Progress() as progress:
                bar = progress.add_task("searcher playing training games", total=len(tasks))

                async def one(task: Any) -> Any:
                    rollout = await explorer.run_episode(task)
                    progress.advance(bar)
                    return rollout

                rollouts = await asyncio.gather(*(one(t) for t in tasks))
            await explorer.close()
    finally:
        await engine.close()
    calls: dict[str, list[Any]] = {}
    for request in engine.requests:  # in call order
        if request.rollout_id is not None:
            calls.setdefault(request.rollout_id, []).append(request)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as f:
        for rollout in rollouts:
            if not rollout.success:
                continue
            for messages in conversations(calls.get(rollout.rollout_id, []), searcher_reply):
                record = {"id": rollout.task_id, "messages": messages}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
    os.replace(tmp, out)
    won = sum(r.success for r in rollouts)
    return {
        "games": len(rollouts),
        "won": won,
        "conversations": written,
        "commands_per_demo": (
            sum(len(r.calls) for r in rollouts if r.success) / won if won else 0.0
        ),
        "failed": sum(not r.ok for r in rollouts),
        "seconds": round(time.perf_counter() - started, 1),
        "out": str(out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=str(ROOT / "examples/alfworld/data/train.jsonl"))
    parser.add_argument("--out", default=str(ROOT / "examples/alfworld/data/demos.jsonl"))
    parser.add_argument("--workflow", default="run", help="the app's workflow (app.py name)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N games (0: all)")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(make_demos(args))))


if __name__ == "__main__":
    main()
