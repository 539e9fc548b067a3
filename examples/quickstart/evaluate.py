"""Measure the quickstart app on the embedded model: reward, tool use, tokens, throughput.

python examples/quickstart/evaluate.py --split test --temperature 1.0 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from agentscope.credential import OpenAICredential
from agentscope.model import OpenAIChatModel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import app  # noqa: E402
from task import load_tasks  # noqa: E402

from agentscope_rft.engines.embedded import EmbeddedEngine  # noqa: E402
from agentscope_rft.gateway.server import Gateway  # noqa: E402


def make_model(
    base_url: str, temperature: float, max_tokens: int, seed: int | None
) -> OpenAIChatModel:
    """An AgentScope model that talks to the gateway (non-streaming, no retries)."""
    return OpenAIChatModel(
        credential=OpenAICredential(api_key="none", base_url=base_url),
        model="policy",
        stream=False,
        max_retries=0,
        parameters=OpenAIChatModel.Parameters(
            max_tokens=max_tokens, temperature=temperature, top_p=1.0
        ),
        extra_body={"seed": seed} if seed is not None else None,
    )


def episode_stats(calls: list) -> dict:
    """Tool use and token counts of one episode's recorded calls."""
    first = calls[0] if calls else None
    return {
        "n_calls": len(calls),
        "tool_call": float(bool(first and first.tool_calls)),
        "malformed": float(
            any("<tool_call>" in (c.content or "") and not c.tool_calls for c in calls)
        ),
        "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
        "completion_tokens": sum(len(c.completion_ids) for c in calls),
        "truncated": float(any(c.finish_reason == "length" for c in calls)),
    }


async def run_episodes(
    gateway: Gateway,
    tasks: list[dict],
    temperature: float,
    max_tokens: int,
    concurrency: int,
    tag: str,
) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int, task: dict) -> dict:
        rid = f"{tag}-{i}"
        async with limit:
            model = make_model(gateway.rollout_base_url(rid), temperature, max_tokens, seed=i)
            error = None
            try:
                reward = await app.run(task, model)
            except Exception as exc:  # a failed episode is data
                reward, error = 0.0, repr(exc)
        calls = await gateway.recorder.take(rid)
        return {
            "task": task,
            "reward": reward,
            "success": float(reward == 1.0),
            "error": error,
            "calls": calls,
            **episode_stats(calls),
        }

    return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))


def summarize(results: list[dict], seconds: float) -> dict:
    def mean(key: str) -> float:
        return statistics.fmean(r[key] for r in results)

    return {
        "episodes": len(results),
        "reward": mean("reward"),
        "accuracy": mean("success"),
        "tool_call_rate": mean("tool_call"),
        "malformed_rate": mean("malformed"),
        "truncated_rate": mean("truncated"),
        "errors": sum(r["error"] is not None for r in results),
        "calls_per_episode": mean("n_calls"),
        "prompt_tokens_per_episode": mean("prompt_tokens"),
        "completion_tokens_per_episode": mean("completion_tokens"),
        "seconds": seconds,
        "episodes_per_s": len(results) / seconds,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1, help="episodes per task")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--show", type=int, default=3, help="episodes to print")
    parser.add_argument("--out", type=Path, default=None, help="write a JSON summary here")
    args = parser.parse_args()

    tasks = load_tasks(HERE / f"tasks_{args.split}.jsonl")[: args.n]
    tasks = [t for t in tasks for _ in range(args.repeat)]
    engine = EmbeddedEngine(args.model, dtype="bfloat16", device="cpu")
    await engine.start()
    async with Gateway(engine) as gateway:
        start = time.perf_counter()
        results = await run_episodes(
            gateway, tasks, args.temperature, args.max_tokens, args.concurrency, "eval"
        )
        summary = summarize(results, time.perf_counter() - start)
    await engine.close()
    for r in results[: args.show]:
        print("---", r["task"]["question"], "=>", r["task"]["answer"], "reward", r["reward"])
        for c in r["calls"]:
            print("  ", repr(engine.tokenizer.decode(c.completion_ids)))
    summary.update(vars(args) | {"out": str(args.out)})
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
