"""Our embedded engine vs transformers' own continuous batching (paged attention), on CPU.

    OMP_NUM_THREADS=1 python benchmarks/hf_continuous_batching.py [--dtype bfloat16]
        [--concurrency 1,8,32]

Both sides compute with the same number of threads (OMP_NUM_THREADS, default: all cores).

Both sides serve the same model object's weights (ours: `ContinuousBatcher` with the prefix cache;
transformers: `model.init_continuous_batching` with `attn_implementation="paged|sdpa"`, block
sharing on, `return_logprobs`). Measured, greedy, end-of-sequence ignored:
- tokens/s for N concurrent distinct 48-token prompts, 32 new tokens each;
- 12 requests sharing a 992-token prefix (+32 own tokens) vs 12 distinct 1,024-token prompts;
- log-prob exactness: max |logprob - reference| over the sampled tokens, the reference being
  one plain fp32-or-dtype forward pass over prompt + completion (teacher forcing);
- a weight swap between two batches (new weights copied into the model in place, the same
  prompt again): does the second batch match the new weights' reference, or reuse stale KV?
Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import time

import torch

from agentscope_rft.models import EMBEDDED_MODEL, resolve_model
from agentscope_rft.types import SamplingParams


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def reference_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


class HFSide:
    name = "transformers continuous batching"

    def __init__(self, model, max_new: int) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.model = model
        # 128 blocks of 256 tokens (its default block size): room for 32k tokens, a fixed size
        # rather than a share of this shared machine's free memory.
        self.config = ContinuousBatchingConfig(
            return_logprobs=True, allow_block_sharing=True, num_blocks=128
        )
        self.generation = GenerationConfig(
            do_sample=False, max_new_tokens=max_new, eos_token_id=-1, pad_token_id=0
        )
        self.manager = model.init_continuous_batching(
            generation_config=self.generation, continuous_batching_config=self.config
        )
        self.manager.start()

    def run(self, prompts: list[list[int]], max_new: int) -> list[tuple[list[int], list[float]]]:
        ids = [
            self.manager.add_request(p, max_new_tokens=max_new, eos_token_id=-1) for p in prompts
        ]
        results = {}
        while len(results) < len(ids):
            out = self.manager.get_result(timeout=600)
            if out is not None and out.is_finished():
                results[out.request_id] = (out.generated_tokens, out.logprobs)
        return [results[i] for i in ids]

    def close(self) -> None:
        self.manager.stop(block=True)


class OurSide:
    name = "ours (ContinuousBatcher + prefix cache)"

    def __init__(self, model, tokenizer, num_threads: int | None) -> None:
        from agentscope_rft.engines.batcher import ContinuousBatcher
        from agentscope_rft.engines.prefix_cache import PrefixCache

        self.batcher = ContinuousBatcher(
            model,
            tokenizer,
            max_model_len=8192,
            prefix_cache=PrefixCache(16, 1 << 30),
            prefill_chunk_tokens=512,
            num_threads=num_threads,
        )
        self.batcher.start()

    def run(self, prompts: list[list[int]], max_new: int) -> list[tuple[list[int], list[float]]]:
        from agentscope_rft.engines.jobs import GenerationJob

        async def go():
            loop = asyncio.get_running_loop()
            jobs = []
            for p in prompts:
                job = GenerationJob(
                    prompt_ids=p,
                    sampling=SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True),
                    max_new_tokens=max_new,
                    loop=loop,
                    done=loop.create_future(),
                )
                self.batcher.submit(job)
                jobs.append(job)
            return [await job.done for job in jobs]

        outs = asyncio.run(go())
        return [(o[0].completion_ids, o[0].logprobs) for o in outs]

    def swap(self) -> None:
        """What the engine does on `load_weights` after copying the weights in."""
        assert self.batcher.prefix_cache is not None
        self.batcher.prefix_cache.clear()
        self.batcher.policy_version += 1

    def close(self) -> None:
        self.batcher.stop()


def measure(side, model, args) -> dict:
    rng = random.Random(0)
    side.run([tokens(rng, 64)], 4)  # warm-up
    row: dict = {"side": side.name}
    for n in args.concurrency:
        prompts = [tokens(rng, 48) for _ in range(n)]
        started = time.perf_counter()
        outs = side.run(prompts, 32)
        row[f"tps_{n}"] = sum(len(o[0]) for o in outs) / (time.perf_counter() - started)
        print(side.name, n, row[f"tps_{n}"], flush=True)
    prefix = tokens(rng, 992)
    for case, prompts in (
        ("shared", [prefix + tokens(rng, 32) for _ in range(12)]),
        ("distinct", [tokens(rng, 1024) for _ in range(12)]),
    ):
        started = time.perf_counter()
        outs = side.run(prompts, 16)
        row[f"{case}_s"] = time.perf_counter() - started
    diffs = [
        max(abs(a - b) for a, b in zip(lp, reference_logprobs(model, p, ids), strict=True))
        for p, (ids, lp) in zip(prompts[:4], outs[:4], strict=True)
    ]
    row["logprob_max_err"] = max(diffs)
    # Weight swap between batches: same prompt before and after new weights.
    probe = prefix + tokens(rng, 40)
    side.run([probe], 8)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.add_(0.02 * torch.randn(tensor.shape, generator=generator).to(tensor.dtype))
    if hasattr(side, "swap"):
        side.swap()
    [(ids, lp)] = side.run([probe], 8)
    ref = reference_logprobs(model, probe, ids)
    row["after_swap_err"] = max(abs(a - b) for a, b in zip(lp, ref, strict=True))
    model.load_state_dict(original)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--sides", default="ours,hf")
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    args = parser.parse_args()
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_grad_enabled(False)
    path = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []
    for name in args.sides.split(","):
        attn = "paged|sdpa" if name == "hf" else "sdpa"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
        model.eval()
        if name == "hf":
            side: HFSide | OurSide = HFSide(model, 32)
        else:  # the same threads as transformers' thread gets: OMP_NUM_THREADS or the default
            side = OurSide(model, AutoTokenizer.from_pretrained(path), None)
        try:
            rows.append(measure(side, model, args))
        finally:
            side.close()
        print(json.dumps(rows[-1]), flush=True)
    threads = torch.get_num_threads()
    print(f"\n{args.model}, {args.dtype}, {threads} threads; uptime at start: {load}\n")
    head = " | ".join(f"{n} concurrent tokens/s" for n in args.concurrency)
    print(
        f"| side | {head} | 12 shared-prefix (s) | 12 distinct (s) | max logprob error | "
        "after a weight swap: max logprob error |"
    )
    print("|---|" + "---:|" * (len(args.concurrency) + 4))
    for r in rows:
        cells = " | ".join(f"{r[f'tps_{n}']:.0f}" for n in args.concurrency)
        print(
            f"| {r['side']} | {cells} | {r['shared_s']:.2f} | {r['distinct_s']:.2f} | "
            f"{r['logprob_max_err']:.2e} | {r['after_swap_err']:.2e} |"
        )


if __name__ == "__main__":
    main()
