"""The data side measured: curriculum vs uniform task selection, replay on vs off, and the group
judge on the web-search example. Results go to docs/benchmarks.md.

    python benchmarks/data_side.py curriculum [--seeds 0 1 2] [--steps 16] [--out DIR]
    python benchmarks/data_side.py replay     [--seeds 0 1 2] [--steps 16] [--out DIR]
    python benchmarks/data_side.py judge      [--steps 3] [--out DIR] [--judge-url URL]
        [--judge-model M] [--free-text] [--judge-temperature T]

`curriculum` and `replay` train the tiny random model (`tiny-random`, the test model) on the
uppercase toy task (`benchmarks/data_mix_app.py`: reward = share of uppercase letters), which a tiny
model learns within ~16 steps, so 3 seeds x 3 arms fit in minutes on 2 cores. `curriculum` trains on
a mix in which half the tasks are far too easy (reward always 1) or too hard (always 0), with three
arms: `uniform`, `curriculum` (success learnability, BOTS) and `informative` (the chance of a group
whose rewards differ); all arms explore the same number of tasks per step, and validation is the
greedy reward on held-out learnable tasks (the run's `val` phase when the run has one, else `eval`).
Reported: the step and the wall time at which validation first reaches `--target`. `replay` trains
on learnable tasks only, with and without `buffer.replay`, and reports validation reward against
episodes explored. `judge` runs the web-search example (SmolLM2-135M on the embedded engine) for a
few steps with the policy itself as group judge and records each group's F1 rewards before and the
judge's scores after: rank agreement (Spearman) and the judge's wall time per step. The judge asks
for its answer's JSON schema (structured output) unless `--free-text`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
APP = f"{HERE / 'data_mix_app.py'}:run"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def toy_tasks(out: Path, counts: tuple[int, int, int] = (12, 0, 0)) -> tuple[Path, Path]:
    """Train tasks (`counts`: learnable, easy, hard) and 8 held-out learnable ones."""
    learnable, easy, hard = counts
    rows = [{"id": f"learn{i}", "prompt": f"Say something {i}", "kind": "learnable"}
            for i in range(learnable)]  # fmt: skip
    rows += [{"id": f"easy{i}", "prompt": f"Say hello {i}", "kind": "easy"} for i in range(easy)]
    rows += [{"id": f"hard{i}", "prompt": f"Say goodbye {i}", "kind": "hard"} for i in range(hard)]
    val = [{"id": f"val{i}", "prompt": f"Say anything {i}", "kind": "learnable"} for i in range(8)]
    return write_jsonl(out / "train.jsonl", rows), write_jsonl(out / "val.jsonl", val)


def toy_config(train: Path, val: Path, run_dir: Path, seed: int, steps: int, *extra: str) -> Any:
    from agentscope_rft.config import load_config

    return load_config(
        None,
        [
            "model.name_or_path=tiny-random",
            f"workflow={APP}",
            f"tasks.train={train}",
            f"tasks.eval={val}",
            "explorer.group_size=8",
            "explorer.tasks_per_step=4",
            "explorer.sampling.max_tokens=8",
            "explorer.eval_sampling.max_tokens=8",
            # validation sampled, as the recorded results were (eval_sampling defaults to greedy)
            "explorer.eval_sampling.temperature=1.0",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            "trainer.lr=5e-2",
            f"run.dir={run_dir}",
            f"run.name={run_dir.name}",
            f"run.seed={seed}",
            f"explorer.seed={seed}",
            f"run.steps={steps}",
            "run.eval_every=2",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            "monitor.console=false",
            # Episodes one at a time, so a run's steps do not depend on the machine's load.
            "run.deterministic=true",
            *extra,
        ],
    )


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def validation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation rows: phase `val` when the run logged one, else `eval`."""
    phase = "val" if any(r.get("phase") == "val" for r in rows) else "eval"
    return [r for r in rows if r.get("phase") == phase and "reward/mean" in r]


async def one_run(config: Any, run_dir: Path) -> dict[str, Any]:
    from agentscope_rft.runtime.local import train

    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.time()
    await train(config, run_dir)
    rows = read_rows(run_dir)
    val = validation(rows)
    train_rows = [r for r in rows if r.get("phase") == "train"]
    return {
        "wall_s": time.time() - started,
        "start": started,
        "val": [(r["step"], r["reward/mean"], r["time"]) for r in val],
        "train_reward": [r.get("reward/mean") for r in train_rows],
        "replay_samples": sum(r.get("replay/samples", 0.0) for r in train_rows),
        "equal_reward_share": [
            r.get("train/zero_variance_groups", r.get("explore/groups_equal_reward"))
            for r in train_rows
        ],
    }


def reached(result: dict[str, Any], target: float) -> tuple[int | None, float | None]:
    """First validation step with reward >= target, and seconds from the run's start."""
    for step, reward, when in result["val"]:
        if reward >= target:
            return step, when - result["start"]
    return None, None


async def curriculum(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / "curriculum"
    out.mkdir(parents=True, exist_ok=True)
    train, val = toy_tasks(out, args.mix)
    arms = {
        "uniform": (),
        "curriculum": ("data.selector.type=curriculum",),
        "informative": (
            "data.selector.type=curriculum",
            "data.selector.learnability=informative",
        ),
    }
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm, extra in arms.items():  # interleaved: machine load hits both arms alike
            run_dir = out / f"{arm}-s{seed}"
            config = toy_config(train, val, run_dir, seed, args.steps, *extra)
            result = await one_run(config, run_dir)
            result["selected"] = _selected_kinds(run_dir)
            results[arm].append(result)
            step, secs = reached(result, args.target)
            print(f"{arm} seed {seed}: target at step {step} ({secs} s), {result['selected']}")
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return {"mix": dict(zip(("learnable", "easy", "hard"), args.mix, strict=True)),
            **summarize(results, args.target, args.steps)}  # fmt: skip


def _selected_kinds(run_dir: Path) -> dict[str, int]:
    stats = json.loads((run_dir / "task_stats.json").read_text())
    kinds: dict[str, int] = {}
    for row in stats["tasks"]:
        kind = row["task_id"].rstrip("0123456789")
        kinds[kind] = kinds.get(kind, 0) + row["selected"]
    return kinds


async def replay(args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / "replay"
    out.mkdir(parents=True, exist_ok=True)
    train, val = toy_tasks(out)
    arms = {
        "off": (),
        "on": ("buffer.replay={ratio: 0.5, max_reuse: 1, max_staleness: 2}",),
    }
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm, extra in arms.items():
            run_dir = out / f"{arm}-s{seed}"
            result = await one_run(
                toy_config(train, val, run_dir, seed, args.steps, *extra), run_dir
            )
            results[arm].append(result)
            print(f"replay {arm} seed {seed}: val {[round(v, 3) for _, v, _ in result['val']]}")
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return summarize(results, args.target, args.steps)


def summarize(
    results: dict[str, list[dict[str, Any]]], target: float, steps: int
) -> dict[str, Any]:
    summary: dict[str, Any] = {"target": target, "steps": steps, "arms": {}}
    for arm, runs in results.items():
        hits = [reached(r, target) for r in runs]
        curves = [[v for _, v, _ in r["val"]] for r in runs]
        summary["arms"][arm] = {
            "steps_to_target": [h[0] for h in hits],
            "seconds_to_target": [round(h[1], 1) if h[1] is not None else None for h in hits],
            "wall_s": [round(r["wall_s"], 1) for r in runs],
            "val_curves": [[round(v, 3) for v in c] for c in curves],
            "val_steps": [s for s, _, _ in runs[0]["val"]],
            "final_val_mean": statistics.mean(c[-1] for c in curves),
            "replay_samples": [r["replay_samples"] for r in runs],
            "selected": [r.get("selected") for r in runs],
        }
    return summary


def snapshot(groups: list[Any], args: dict[str, Any]) -> list[Any]:
    """A custom operator: append each group's episode rewards to `args["path"]`, change nothing."""
    with open(args["path"], "a", encoding="utf-8") as handle:
        for group in groups:
            rewards = {e.rollout_id: e.reward for e in group.episodes}
            handle.write(json.dumps({"phase": args["phase"], "group": group.group_id,
                                     "rewards": rewards}) + "\n")  # fmt: skip
    return groups


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rho with average ranks for ties; None when either side is constant."""
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return sxy / (sx * sy) if sx > 0 and sy > 0 else None


async def judge(args: argparse.Namespace) -> dict[str, Any]:
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.local import train

    out = args.out / "judge"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    record = out / "judge_rewards.jsonl"
    spec = f"{Path(__file__).resolve()}:snapshot"
    endpoint = (
        f"max_tokens: {args.judge_max_tokens}, max_retries: 1, timeout: 300, "
        f"temperature: {args.judge_temperature}, "
        f"structured_output: {'false' if args.free_text else 'true'}"
    )
    if args.judge_url:  # another model as judge (default: the policy, through the gateway)
        endpoint += f", base_url: '{args.judge_url}', model: '{args.judge_model}'"
    operators = (
        f"[{{type: custom, path: '{spec}', name: before, args: {{path: '{record}', phase: f1}}}}, "
        "{type: group_judge, reference_field: answer, "
        f"endpoint: {{{endpoint}}}}}, "
        f"{{type: custom, path: '{spec}', name: after, args: {{path: '{record}', phase: judge}}}}]"
    )
    run_dir = out / "run"
    config = load_config(
        ROOT / "examples" / "web_search" / "config.yaml",
        [
            f"run.dir={run_dir}",
            f"run.steps={args.steps}",
            "run.eval_every=0",
            "run.checkpoint_every=0",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            f"data.operators={operators}",
        ],
    )
    started = time.time()
    await train(config, run_dir)
    wall = time.time() - started
    rows = [r for r in read_rows(run_dir) if r.get("phase") == "train"]
    pairs: dict[str, dict[str, dict[str, float]]] = {}
    for line in record.read_text().splitlines():
        item = json.loads(line)
        pairs.setdefault(item["group"], {})[item["phase"]] = item["rewards"]
    per_group, pooled_f1, pooled_judge, judged = [], [], [], 0
    for rewards in pairs.values():
        f1, scores = rewards.get("f1", {}), rewards.get("judge", {})
        keys = [k for k in f1 if k in scores]
        if not keys or all(f1[k] == scores[k] for k in keys):
            continue  # the judge failed on this group (rewards kept)
        judged += 1
        x, y = [f1[k] for k in keys], [scores[k] for k in keys]
        pooled_f1 += x
        pooled_judge += y
        rho = spearman(x, y)
        if rho is not None:
            per_group.append(rho)
    return {
        "steps": args.steps,
        "structured_output": not args.free_text,
        "judge_temperature": args.judge_temperature,
        "groups": len(pairs),
        "groups_judged": judged,
        "judge_calls": sum(r.get("data/group_judge/calls", 0.0) for r in rows),
        "judge_failures": sum(r.get("data/group_judge/failures", 0.0) for r in rows),
        "spearman_mean_per_group": statistics.mean(per_group) if per_group else None,
        "groups_with_rho": len(per_group),
        "spearman_pooled": spearman(pooled_f1, pooled_judge) if len(pooled_f1) > 2 else None,
        "judge_wall_s_per_step": [
            round(r.get("data/group_judge/wall_seconds", 0.0), 1) for r in rows
        ],
        "explore_s_per_step": [round(r.get("time/explore", 0.0), 1) for r in rows],
        "step_s": [round(r.get("time/step", 0.0), 1) for r in rows],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("measure", choices=["curriculum", "replay", "judge"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--target", type=float, default=0.5, help="validation reward to reach")
    parser.add_argument("--judge-max-tokens", type=int, default=96)
    parser.add_argument("--judge-url", help="OpenAI-compatible base URL of another judge model")
    parser.add_argument("--judge-model", default="judge", help="its model name")
    parser.add_argument("--judge-temperature", type=float, default=0.0)
    parser.add_argument(
        "--free-text", action="store_true", help="judge without response_format (extract_json)"
    )
    parser.add_argument(
        "--mix",
        type=lambda text: tuple(int(x) for x in text.split(":")),
        default=(12, 6, 6),
        help="curriculum: learnable:easy:hard train tasks (default 12:6:6, half useless)",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/agentscope-rft-data-side"))
    args = parser.parse_args()
    print("command: python benchmarks/data_side.py " + " ".join(sys.argv[1:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    measure = {"curriculum": curriculum, "replay": replay, "judge": judge}[args.measure]
    result = asyncio.run(measure(args))
    result["command"] = "python benchmarks/data_side.py " + " ".join(sys.argv[1:])
    path = args.out / f"{args.measure}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
