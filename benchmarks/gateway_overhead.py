"""What the gateway and its recording add per call, against a stub engine that answers at once.

    python benchmarks/gateway_overhead.py [--concurrency 64] [--seconds 10]

The gateway (with a stub engine: fixed prompt/completion ids, no model) runs in its own process,
as in real use; a load generator (aiohttp) in this process keeps `--concurrency` attributed
requests (`/rollouts/<id>/v1/chat/completions`, distinct rollout ids, so every call is recorded)
in flight. Reported, side by side with calling the stub engine directly in-process:
- server-side time per call (ASGI entry to last response byte: parsing, validation, engine call,
  recording, response building), p50/p99, at the given concurrency;
- throughput (calls/s) at that concurrency;
- client-observed latency with one request at a time, p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp

from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    GenerationOutput,
    PromptReady,
)
from agentscope_rft.types import SamplingParams

BODY = json.dumps(
    {
        "model": "stub",
        "messages": [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "What is the capital of France? " * 8},
        ],
        "max_tokens": 32,
    }
).encode()


class StubEngine:
    """Answers instantly with fixed ids: measures everything but the model."""

    model_name = "stub"
    policy_version = 0
    max_model_len = 4096

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return ["x"] * len(token_ids)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> list:
        return [GenerationOutput([1] * 16, [-0.5] * 16, "stop", 0)]

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        yield PromptReady(list(range(200)))
        yield ChoiceDone(
            ChoiceResult(0, list(range(16)), [-0.5] * 16, "stop", 0, "Paris.", "Paris.")
        )

    async def load_weights(self, weights: object, version: int) -> float:
        return 0.0


def _serve(port: int, ready: multiprocessing.synchronize.Event) -> None:
    import uvloop

    from agentscope_rft.gateway.server import Gateway

    async def run() -> None:
        gateway = Gateway(StubEngine(), port=port)  # type: ignore[arg-type]
        timings: list[float] = []
        inner = gateway.app

        async def timed(scope, receive, send):  # type: ignore[no-untyped-def]
            if scope["type"] != "http" or scope["path"] == "/bench-stats":
                if scope["type"] == "http":
                    body = json.dumps(timings[-200_000:]).encode()
                    timings.clear()
                    await send({"type": "http.response.start", "status": 200, "headers": []})
                    await send({"type": "http.response.body", "body": body})
                    return
                await inner(scope, receive, send)
                return
            started = time.perf_counter()
            await inner(scope, receive, send)
            timings.append(time.perf_counter() - started)

        gateway.app = timed  # type: ignore[assignment]
        await gateway.start()
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(run())


async def direct_engine(samples: int) -> list[float]:
    engine = StubEngine()
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        request = ChatRequest(messages=[], sampling=SamplingParams())
        async for _event in engine.chat(request):
            pass
        out.append(time.perf_counter() - started)
    return out


async def load(url: str, concurrency: int, seconds: float) -> tuple[int, list[float]]:
    latencies: list[float] = []
    done = 0
    stop_at = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(w: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                async with session.post(
                    f"{url}/rollouts/w{w}-{i}/v1/chat/completions",
                    data=BODY,
                    headers={"content-type": "application/json"},
                ) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                latencies.append(time.perf_counter() - started)
                done += 1
                i += 1

        await asyncio.gather(*[worker(w) for w in range(concurrency)])
    return done, latencies


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def main(args: argparse.Namespace) -> None:
    port = args.port
    ready = multiprocessing.get_context("spawn").Event()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, ready))
    server.start()
    ready.wait(60)
    url = f"http://127.0.0.1:{port}"
    try:
        await load(url, 4, 1.0)  # warm-up
        async with aiohttp.ClientSession() as session:
            await (await session.get(f"{url}/bench-stats")).read()
        calls, _ = await load(url, args.concurrency, args.seconds)
        async with aiohttp.ClientSession() as session:
            server_side = json.loads(await (await session.get(f"{url}/bench-stats")).read())
        _, sequential = await load(url, 1, min(args.seconds, 5.0))
    finally:
        server.terminate()
        server.join()
    direct = await direct_engine(2000)
    throughput = calls / args.seconds
    print(
        f"\nGateway overhead, stub engine, {os.cpu_count()} CPUs, gateway and load generator "
        "in separate processes\n"
    )
    print("| measure | p50 (ms) | p99 (ms) |")
    print("|---|---:|---:|")
    print(
        f"| stub engine called directly (baseline) | {pct(direct, 0.5):.3f} | "
        f"{pct(direct, 0.99):.3f} |"
    )
    print(
        f"| gateway server-side time per call, {args.concurrency} concurrent | "
        f"{pct(server_side, 0.5):.2f} | {pct(server_side, 0.99):.2f} |"
    )
    print(
        f"| client latency, one request at a time | {pct(sequential, 0.5):.2f} | "
        f"{pct(sequential, 0.99):.2f} |"
    )
    print(
        f"\nThroughput at {args.concurrency} concurrent: {throughput:.0f} calls/s "
        f"({calls} recorded calls in {args.seconds:.0f} s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=18931)
    asyncio.run(main(parser.parse_args()))
