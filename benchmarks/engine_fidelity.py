"""Do the engines sample the policy the trainer trains? Engine log-probs vs an fp32 reference on
real episodes of an example, per engine.

    python benchmarks/engine_fidelity.py [--config examples/web_search/config.yaml]
        [--engines embedded,vllm] [--steps 2] [--model PATH]

Each engine explores the config's first `--steps` steps' worth of training tasks (the same tasks,
the config's sampling) through `agentscope-rft explore`, in its own process, one after the other.
Then the model (`--model`, default the config's) scores every recorded sample in fp32 with
transformers' forward, and each sampled token's engine log-prob is compared with that reference.

Reported per engine: mean reward, tokens scored, mean/p99/max |engine - reference| log-prob,
the mean signed gap (an engine whose log-probs run high or low), the share of tokens off by more
than 0.1 and 1.0, a k3 estimate of KL(engine || reference) over sampled tokens, and the sampler
check: the sampled tokens' mean surprisal under the reference (-log p) next to the mean entropy of
the distributions they were drawn from. A sampler that draws from the policy makes the two equal
up to noise (more surprisal: it picks unlikely tokens too often; less: it sharpens). An engine
that samples the trained policy shows bf16-sized gaps (mean ~1e-2) and no heavy tail.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quickstart_explore import ROOT, explore_command

from agentscope_rft.buffer.export import iter_stored_samples
from agentscope_rft.models import load_causal_lm, resolve_model
from agentscope_rft.types import Sample


def explore(name: str, config: Path, limit: int, out: Path, model: str | None) -> Path:
    command = explore_command(name, config, yaml.safe_load(config.read_text()) or {}, limit, out)
    if model is not None:
        command += ["--set", f"model.name_or_path={model}"]
    subprocess.run(command, check=True, cwd=ROOT)
    return out / name


def reference(
    model: torch.nn.Module, sample: Sample, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-probs under `model` at `temperature` of the trained tokens of `sample` (loss mask
    1, the first token excepted), and the entropy of the distribution each was drawn from."""
    ids = torch.tensor([sample.token_ids])
    trained = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)  # [T - 1]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1][trained].float() / temperature  # [N, V]
    all_logprobs = logits.log_softmax(-1)
    entropy = -(all_logprobs.exp() * all_logprobs).sum(-1)
    chosen = ids[0, 1:][trained]
    return all_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1), entropy


def score(run_dir: Path, model: torch.nn.Module, temperature: float) -> dict[str, float]:
    gaps, refs, engine_lps, entropies = [], [], [], []
    rewards = []
    for sample in iter_stored_samples(run_dir / "buffer.db"):
        rewards.append(sample.reward)
        trained = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)
        engine = torch.tensor(sample.logprobs[1:], dtype=torch.float32)[trained]
        ref, entropy = reference(model, sample, temperature)
        entropies.append(entropy)
        gaps.append(engine - ref)
        refs.append(ref)
        engine_lps.append(engine)
    if not gaps:
        raise SystemExit(f"{run_dir}: no samples to score (did every episode fail? rollouts.jsonl)")
    gap, ref, engine = torch.cat(gaps), torch.cat(refs), torch.cat(engine_lps)
    absolute = gap.abs()
    log_ratio = ref - engine  # log p_ref / p_engine at tokens drawn from the engine
    return {
        "samples": len(rewards),
        "reward": sum(rewards) / max(len(rewards), 1),
        "tokens": int(gap.numel()),
        "mean_abs": float(absolute.mean()),
        "p99_abs": float(absolute.quantile(0.99)),
        "max_abs": float(absolute.max()),
        "mean_signed": float(gap.mean()),
        "over_0.1": float((absolute > 0.1).float().mean()),
        "over_1": float((absolute > 1.0).float().mean()),
        "ref_logprob": float(ref.mean()),
        "ref_entropy": float(torch.cat(entropies).mean()),
        "engine_logprob": float(engine.mean()),
        "kl_k3": float((log_ratio.exp() - 1 - log_ratio).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples/web_search/config.yaml")
    parser.add_argument("--engines", default="embedded,vllm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", help="a checkpoint folder instead of the config's model")
    parser.add_argument("--keep", type=Path, help="keep the explore folders here")
    args = parser.parse_args()
    data = yaml.safe_load(args.config.read_text()) or {}
    explorer = data.get("explorer") or {}
    limit = int(explorer.get("tasks_per_step", 4)) * args.steps
    temperature = float((explorer.get("sampling") or {}).get("temperature", 1.0))
    if temperature == 0:
        raise SystemExit("the config samples greedily: nothing to compare")
    model_name = args.model or (data.get("model") or {}).get(
        "name_or_path", "smollm2-135m-instruct"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        dirs = {
            name: explore(name, args.config, limit, out, args.model)
            for name in args.engines.split(",")
        }
        model = load_causal_lm(resolve_model(model_name), dtype=torch.float32)
        rows = {name: score(path, model, temperature) for name, path in dirs.items()}
    for name, row in rows.items():
        print(json.dumps({"engine": name, **row}))
    print(f"\n{args.config} train split, {limit} tasks, T={temperature}, model {model_name}\n")
    print(
        "| engine | samples | mean reward | tokens | mean abs gap | p99 | max | mean signed "
        "| > 0.1 | > 1.0 | KL k3 | surprisal | entropy |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['samples']} | {r['reward']:.3f} | {r['tokens']} | {r['mean_abs']:.4f} "
            f"| {r['p99_abs']:.3f} | {r['max_abs']:.2f} | {r['mean_signed']:+.4f} "
            f"| {r['over_0.1']:.4f} | {r['over_1']:.5f} | {r['kl_k3']:.2e} "
            f"| {-r['ref_logprob']:.3f} | {r['ref_entropy']:.3f} |"
        )
    if not all(math.isfinite(r["mean_abs"]) for r in rows.values()):
        raise SystemExit("a gap is not finite")


if __name__ == "__main__":
    main()
