"""Seeds as a first-class axis: `agentscope-rft train --config x.yaml --seeds 0,1,2`.

One config runs once per seed, each seed's run in its own folder under the config's run folder
(the sweep folder)::

    runs/<name>/sweep.json        seeds, their folders and status, the config, the git commit
    runs/<name>/config.yaml       the resolved config every seed starts from
    runs/<name>/seed-<k>/         an ordinary run folder (`train --resume` works on it)
    runs/<name>/summary.{json,md} + seeds.png   written when the sweep ends (sweep_summary.py)

Seeds run in child processes (`python -m agentscope_rft.cli train ...`): memory is freed between
seeds, and a seed that crashes is reported while the sweep goes on. Running the same command again
(or `train --resume runs/<name>`) continues: finished seeds are skipped, a seed killed mid-run
resumes from its checkpoint, pending seeds run.

The sweep seed `k` sets `run.seed` (task order, trainer initialization, mini-batch order) and,
unless the config sets them explicitly, `explorer.seed` (the sampling streams of episodes) and
`engine.seed` (requests without a seed). A key the user set keeps its value in every seed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from agentscope_rft.config import RunConfig, dump_config
from agentscope_rft.files import replace_text
from agentscope_rft.runtime.signals import EXIT_STOPPED

# (not imported from runtime.components: that imports the explorer, AgentScope and transformers,
# seconds the CLI must not spend before its checks)
STATE_FILE = "state.json"

logger = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
# The untrained model's test evaluation in a sweep's folder (`--test`): a folder holding only an
# earlier one (copied in to reuse it) is a new sweep's folder, not a run's.
BASELINE_DIR = "test-untrained"
BEST_TEST_DIR = "test-best"
"""A seed's best checkpoint on the test split, in its run folder (`--test`)."""
SWEEP_CONFIG = "config.yaml"
FOLLOWING_KEYS = ("explorer.seed", "engine.seed")
"""Seeds that follow the sweep seed unless the config sets them (`run.seed` always follows)."""
_IGNORED_IN_MATCH = (
    ("run", "seed"),
    ("run", "overwrite"),
    ("explorer", "seed"),
    ("engine", "seed"),
)
"""Keys that may differ between a sweep folder's config and the command that continues it."""
MAX_SEEDS = 1000


class SweepError(ValueError):
    """Bad `--seeds`/`--parallel`, or a sweep folder that cannot be used as asked."""


def parse_seeds(text: str) -> list[int]:
    """`0,1,2`, `0-4` or a mix (`0-2,7`) -> the seeds, in the order given.

    Raises:
        SweepError: an empty item, a non-integer, a range that runs backwards, a repeated seed.

    Example:
        >>> parse_seeds("0-2,7")
        [0, 1, 2, 7]
    """
    seeds: list[int] = []
    for item in text.split(","):
        item = item.strip()
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", item)
        if match is None:
            raise SweepError(
                f"--seeds {text!r}: {item!r} is not a seed (non-negative integer) or range; use "
                "e.g. --seeds 0,1,2 or --seeds 0-4"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise SweepError(
                f"--seeds {text!r}: the range {item!r} runs backwards; use {last}-{first}"
            )
        seeds.extend(range(first, last + 1))
        if len(seeds) > MAX_SEEDS:
            raise SweepError(f"--seeds {text!r}: more than {MAX_SEEDS} seeds")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise SweepError(f"--seeds {text!r}: seed(s) {repeated} given more than once")
    return seeds


def is_sweep(folder: Path) -> bool:
    """Whether `folder` is a sweep folder (has `sweep.json`)."""
    return (folder / SWEEP_FILE).is_file()


def seed_folder(seed: int) -> str:
    return f"seed-{seed}"


# --------------------------------------------------------------------------- the sweep's record


def git_commit() -> str | None:
    """The commit of the working directory's checkout (null outside git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def read_sweep(sweep_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SweepError(f"cannot read {sweep_dir / SWEEP_FILE}: {exc}") from exc
    return data


def write_sweep(sweep_dir: Path, data: dict[str, Any]) -> None:
    """Replace `sweep.json` atomically (a reader never sees half a file)."""
    replace_text(sweep_dir / SWEEP_FILE, json.dumps(data, indent=1))


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(json.dumps(config))
    for section, key in _IGNORED_IN_MATCH:
        if isinstance(data.get(section), dict):
            data[section].pop(key, None)
    return data


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """`key: old -> new` for each leaf of two resolved configs (dicts) that differs.

    Example:
        >>> config_diff({"trainer": {"lr": 1e-5, "dtype": "auto"}}, {"trainer": {"lr": 2e-5}})
        ["trainer.dtype: 'auto' -> None", 'trainer.lr: 1e-05 -> 2e-05']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(set(old) | set(new))
            for d in config_diff(old.get(key), new.get(key), f"{prefix}{key}.")
        ]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def following_keys(config: RunConfig) -> list[str]:
    """`run.seed` and the seeds of `FOLLOWING_KEYS` the config leaves at their default."""
    keys = ["run.seed"]
    if "seed" not in config.explorer.model_fields_set:
        keys.append("explorer.seed")
    if "seed" not in config.engine.model_fields_set:
        keys.append("engine.seed")
    return keys


def open_sweep(
    config: RunConfig,
    sweep_dir: Path,
    seeds: Sequence[int],
    fork: tuple[Path, int] | None = None,
) -> dict[str, Any]:
    """Create the sweep folder, or continue the one there when its config matches.

    Seeds not yet in an existing sweep are added to it (finished ones stay). A sweep folder with
    another config is refused (replaced with `run.overwrite`); an ordinary run folder is refused;
    a folder holding only evaluations (`test-untrained/` copied in to reuse it, `explore-*/` of an
    `explore` of the config before the sweep) becomes the sweep's.
    `fork`: (source sweep folder, step): each seed starts from the same seed's checkpoint there
    (`runtime.fork`); recorded in `sweep.json`, and a continuing command may not change it.
    """
    resolved = config.model_dump(mode="json")
    forked = None if fork is None else _fork_record(fork, seeds)
    if sweep_dir.exists() and not all(_evaluation_only(p) for p in sweep_dir.iterdir()):
        if not is_sweep(sweep_dir):
            if not config.run.overwrite:
                raise SweepError(
                    f"{sweep_dir} is a run folder, not a sweep: pick another run.name or run.dir "
                    "for the sweep, or pass --set run.overwrite=true to replace it"
                )
            logger.warning("run.overwrite: replacing %s with a sweep", sweep_dir)
            shutil.rmtree(sweep_dir)
        else:
            data = read_sweep(sweep_dir)
            diff = config_diff(_comparable(data.get("config", {})), _comparable(resolved))
            if not diff:
                forked = _same_fork(sweep_dir, data.get("fork"), forked, seeds)
                added = [s for s in seeds if s not in data["seeds"]]
                # Each seed's commit: a sweep continued later may run its new seeds on another.
                commits = data.setdefault(
                    "commits", {str(s): data.get("commit") for s in data["seeds"]}
                )
                data["seeds"] = [*data["seeds"], *added]
                if forked is not None:
                    data["fork"] = forked
                commit = git_commit() if added else None
                for seed in added:
                    data["runs"][str(seed)] = seed_folder(seed)
                    data["status"][str(seed)] = "pending"
                    commits[str(seed)] = commit
                write_sweep(sweep_dir, data)
                logger.info(
                    "sweep %s exists with this config: continuing (seeds %s)",
                    sweep_dir,
                    data["seeds"],
                )
                return data
            if not config.run.overwrite:
                shown = "; ".join(diff[:5]) + (
                    f"; and {len(diff) - 5} more" if len(diff) > 5 else ""
                )
                raise SweepError(
                    f"sweep folder {sweep_dir} was started with another config ({shown}): "
                    "continue it with `agentscope-rft train --resume "
                    f"{sweep_dir}`, pick another run.name, or pass --set run.overwrite=true to "
                    "replace it"
                )
            logger.warning(
                "run.overwrite: replacing the sweep in %s (its config differs)", sweep_dir
            )
            shutil.rmtree(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SWEEP_CONFIG).write_text(dump_config(config))
    commit = git_commit()
    data = {
        "seeds": list(seeds),
        "runs": {str(s): seed_folder(s) for s in seeds},
        "status": {str(s): "pending" for s in seeds},
        "follow": following_keys(config),
        "config": resolved,
        "commit": commit,
        "commits": {str(s): commit for s in seeds},
    }
    if forked is not None:
        data["fork"] = forked
    write_sweep(sweep_dir, data)
    return data


def _evaluation_only(path: Path) -> bool:
    """An evaluation a new sweep's folder may hold already: the untrained model's test evaluation
    copied in (`test-untrained/`), or an `explore` of the config (`explore-<split>[-<ckpt>]/`)."""
    return path.name == BASELINE_DIR or (path.is_dir() and path.name.startswith("explore-"))


def _fork_record(fork: tuple[Path, int], seeds: Sequence[int]) -> dict[str, Any]:
    """`{"from": <source sweep>, "step": k, "runs": {seed: folder}}`; every seed must be there."""
    source, step = fork
    if not is_sweep(source):
        raise SweepError(
            f"--fork-from {source}: not a seed sweep (no {SWEEP_FILE}); a sweep forks each seed "
            "from the same seed of a sweep, so give the sweep folder (runs/<name>)"
        )
    runs = read_sweep(source).get("runs", {})
    missing = [s for s in seeds if str(s) not in runs]
    if missing:
        raise SweepError(
            f"--fork-from {source}: it has no seed(s) {missing} (it has {sorted(map(int, runs))}); "
            "fork those seeds only, or run them there first"
        )
    return {
        "from": str(source.resolve()),
        "step": step,
        "runs": {str(s): str((source / runs[str(s)]).resolve()) for s in seeds},
    }


def _same_fork(
    sweep_dir: Path, recorded: dict[str, Any] | None, asked: dict[str, Any] | None, seeds: Any
) -> dict[str, Any] | None:
    """A continuing command keeps the sweep's fork (or its absence); new seeds' sources added."""
    if asked is None:
        return recorded
    if recorded is None or (recorded["from"], recorded["step"]) != (asked["from"], asked["step"]):
        was = "no fork" if recorded is None else f"{recorded['from']} at step {recorded['step']}"
        raise SweepError(
            f"sweep folder {sweep_dir} was started with {was}, not --fork-from {asked['from']} "
            f"--fork-step {asked['step']}: continue it with `agentscope-rft train --resume "
            f"{sweep_dir}`, or pick another run.name"
        )
    return {**recorded, "runs": {**recorded["runs"], **asked["runs"]}}


# --------------------------------------------------------------------------- running the seeds


def seed_command(sweep_dir: Path, data: dict[str, Any], seed: int, log_level: str) -> list[str]:
    """The child command of one seed: a resume from its checkpoint, else a fresh run."""
    run_dir = sweep_dir / data["runs"][str(seed)]
    cli = [sys.executable, "-m", "agentscope_rft.cli", "train", "--log-level", log_level]
    if (run_dir / STATE_FILE).is_file():
        return [*cli, "--resume", str(run_dir)]
    name = data["config"]["run"].get("name") or "run"
    fork = data.get("fork")
    if fork is not None:  # the same seed's checkpoint of the source sweep
        cli += ["--fork-from", fork["runs"][str(seed)], "--fork-step", str(fork["step"])]
    sets = [
        f"run.dir={run_dir}",
        f"run.name={name}-seed-{seed}",
        "run.overwrite=true",  # the seed's own folder: a start that died before its checkpoint
        *(f"{key}={seed}" for key in data.get("follow", ["run.seed"])),
    ]
    return [
        *cli,
        "--config",
        str(sweep_dir / SWEEP_CONFIG),
        *(x for s in sets for x in ("--set", s)),
    ]


def seed_finished(run_dir: Path, steps: int) -> bool:
    """Whether the seed's run saved its last step (a sweep killed after it ended)."""
    if not (run_dir / STATE_FILE).is_file():
        return False
    from agentscope_rft.runtime.components import read_state

    try:
        return int(read_state(run_dir).get("step", -1)) >= steps
    except ValueError:
        return False


@dataclass
class _Child:
    seed: int
    process: subprocess.Popen[bytes]
    started: float
    log: Any = None


@dataclass
class SweepRun:
    """Runs a sweep's seeds that are not done, `parallel` at once, updating `sweep.json`."""

    sweep_dir: Path
    parallel: int = 1
    log_level: str = "INFO"
    stopping: bool = False
    children: list[_Child] = field(default_factory=list)

    def run(self) -> list[int]:
        """Run every seed not done; returns the failed seeds. Raises `SweepStopped` on a signal."""
        data = read_sweep(self.sweep_dir)
        steps = int(data["config"]["run"]["steps"])
        todo: list[int] = []
        for seed in data["seeds"]:
            run_dir = self.sweep_dir / data["runs"][str(seed)]
            if data["status"].get(str(seed)) == "done" or seed_finished(run_dir, steps):
                data["status"][str(seed)] = "done"
            else:
                data["status"][str(seed)] = "pending"
                todo.append(seed)
        write_sweep(self.sweep_dir, data)
        total, skipped = len(data["seeds"]), total_done(data)
        if skipped:
            logger.info("sweep: %d of %d seed(s) already done, skipped", skipped, total)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            while (todo or self.children) and not self.stopping:
                while todo and len(self.children) < self.parallel and not self.stopping:
                    self._start(data, todo.pop(0))
                self._reap(data)
                time.sleep(0.2)
            self._wait_children(data)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.stopping:
            raise SweepStopped(
                f"sweep stopped; {total_done(data)} of {total} seed(s) done: continue with "
                f"`agentscope-rft train --resume {self.sweep_dir}`"
            )
        return [s for s in data["seeds"] if data["status"][str(s)] == "failed"]

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:  # a second signal: stop the children at once
            for child in self.children:
                child.process.kill()
            return
        self.stopping = True
        logger.warning("sweep: %s: stopping the running seed(s)", signal.Signals(signum).name)
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    def _start(self, data: dict[str, Any], seed: int) -> None:
        _wait_for_earlier(data, seed)
        command = seed_command(self.sweep_dir, data, seed, self.log_level)
        resumed = "--resume" in command
        position = data["seeds"].index(seed) + 1
        logger.info(
            "sweep: seed %d (%d of %d; %d done)%s",
            seed,
            position,
            len(data["seeds"]),
            total_done(data),
            ": resuming from its checkpoint" if resumed else "",
        )
        log = None
        if self.parallel > 1:  # parallel seeds would interleave on the console
            (self.sweep_dir / "logs").mkdir(exist_ok=True)
            log = open(self.sweep_dir / "logs" / f"seed-{seed}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep, which stops them
            preexec_fn=_stop_with_parent,
        )
        self.children.append(_Child(seed, process, time.perf_counter(), log))
        data["status"][str(seed)] = "running"
        data.setdefault("pids", {})[str(seed)] = process.pid
        write_sweep(self.sweep_dir, data)

    def _reap(self, data: dict[str, Any]) -> None:
        for child in [c for c in self.children if c.process.poll() is not None]:
            self.children.remove(child)
            if child.log is not None:
                child.log.close()
            code, seconds = child.process.returncode, time.perf_counter() - child.started
            key = str(child.seed)
            if code == 0:
                data["status"][key] = "done"
                logger.info(
                    "sweep: seed %d done in %.0f s (%d of %d done)",
                    child.seed, seconds, total_done(data), len(data["seeds"]),
                )  # fmt: skip
            elif code == EXIT_STOPPED or (self.stopping and code < 0):
                data["status"][key] = "pending"
                logger.warning("sweep: seed %d stopped; it resumes from its checkpoint", child.seed)
            else:
                data["status"][key] = "failed"
                where = (
                    f" (log: {self.sweep_dir / 'logs' / f'seed-{child.seed}.log'})"
                    if child.log
                    else ""
                )
                logger.error(
                    "sweep: seed %d failed with exit code %d after %.0f s%s; going on",
                    child.seed, code, seconds, where,
                )  # fmt: skip
            write_sweep(self.sweep_dir, data)

    def _wait_children(self, data: dict[str, Any]) -> None:
        while self.children:
            self._reap(data)
            time.sleep(0.2)


def _stop_with_parent() -> None:
    """In the child, before exec: a SIGTERM when the sweep dies (even by SIGKILL), so the seed
    stops cleanly at a checkpoint instead of running on unseen (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait_for_earlier(data: dict[str, Any], seed: int) -> None:
    """A seed of a killed sweep may still be saving its checkpoint: wait until it has exited."""
    pid = data.get("pids", {}).get(str(seed))
    if pid is None or not _is_seed_process(int(pid)):
        return
    logger.info("sweep: seed %d: waiting for its earlier process (pid %d) to stop", seed, pid)
    while _is_seed_process(int(pid)):
        time.sleep(0.2)


def _is_seed_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return b"agentscope_rft" in cmdline and stat.rsplit(")", 1)[-1].split()[0] != "Z"


class SweepStopped(RuntimeError):
    """The sweep was stopped by a signal; its seeds continue with `--resume <sweep folder>`."""


def total_done(data: dict[str, Any]) -> int:
    return sum(1 for s in data["seeds"] if data["status"].get(str(s)) == "done")


# --------------------------------------------------------------------------- how many at once


def choose_parallel(config: RunConfig, requested: str, seeds: int) -> int:
    """Seeds run at once: `requested` as a number, or `auto` (one log line says why).

    `auto` on `runtime.type: local` is 1. On `ray` it is how many runs the free resources hold:
    the cluster's available CPUs/GPUs when the config (or `$RAY_ADDRESS`) names one, else this
    machine's (each run then starts its own local cluster); one run needs its runners' and vLLM
    replicas' resources (`runtime.*`) plus 1 CPU for its own process, and 1 GPU for its trainer
    and embedded engine when there are GPUs.

    Raises:
        SweepError: `requested` is neither `auto` nor a positive integer.
    """
    if requested != "auto":
        if not requested.isdigit() or int(requested) < 1:
            raise SweepError(f"--parallel {requested!r}: use a positive integer or auto")
        return min(int(requested), max(seeds, 1))
    if config.runtime.type == "local":
        logger.info("sweep: --parallel auto -> 1 (runtime.type local: seeds run one at a time)")
        return 1
    cpus, gpus, where = _free_resources(config)
    from agentscope_rft.runtime.ray.cluster import resource_needs

    needs = resource_needs(config.runtime, config.trainer, config.engine, gpus)
    need_cpus = needs.total("CPU") + 1.0
    need_gpus = needs.total("GPU") + (1.0 if gpus > 0 else 0.0)
    fits = int(cpus // need_cpus)
    if need_gpus > 0:
        fits = min(fits, int(gpus // need_gpus))
    chosen = max(1, min(fits, seeds))
    logger.info(
        "sweep: --parallel auto -> %d: %s has %g free CPUs and %g GPUs; one run needs %g CPUs "
        "and %g GPUs (runtime.runners/replicas + its own process); %d seed(s)",
        chosen, where, cpus, gpus, need_cpus, need_gpus, seeds,
    )  # fmt: skip
    return chosen


def _free_resources(config: RunConfig) -> tuple[float, float, str]:
    address = config.runtime.address or os.environ.get("RAY_ADDRESS")
    if address:
        import ray

        ray.init(address=address, log_to_driver=False)
        try:
            free = ray.available_resources()
        finally:
            ray.shutdown()
        return float(free.get("CPU", 0.0)), float(free.get("GPU", 0.0)), f"the cluster at {address}"
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        pass
    cpus = os.cpu_count() or 1
    return float(cpus), float(gpus), "this machine"


def run_sweep(
    config: RunConfig,
    sweep_dir: Path,
    seeds: Sequence[int],
    *,
    parallel: str = "auto",
    log_level: str = "INFO",
    test: bool = False,
    fork: tuple[Path, int] | None = None,
) -> dict[str, Any]:
    """Run (or continue) the sweep of `config` over `seeds` in `sweep_dir`, then summarize it.

    Returns the summary (`sweep_summary.summarize`); the failed seeds are its `failed` list.

    Raises:
        SweepError: bad `parallel`, a sweep folder with another config, or `test` without a test
            split.
        SweepStopped: a signal stopped the sweep (the seeds resume with `--resume <sweep_dir>`).

    Example:
        >>> config = load_config("examples/quickstart/config.yaml")  # doctest: +SKIP
        >>> run_sweep(config, Path("runs/quickstart"), [0, 1, 2])["best"]  # doctest: +SKIP
    """
    from agentscope_rft.runtime.sweep_summary import summarize

    if test and config.tasks.eval is None:  # found now, not after every seed has trained
        raise SweepError(
            "--test: the config has no test split (tasks.test): set it (in the config, or "
            "--set tasks.test=PATH), or leave out --test"
        )
    data = open_sweep(config, sweep_dir, seeds, fork)
    at_once = choose_parallel(config, parallel, len(data["seeds"]))
    logger.info(
        "sweep %s: seeds %s, %d at a time; follow the sweep seed: %s",
        sweep_dir, data["seeds"], at_once, ", ".join(data["follow"]),
    )  # fmt: skip
    SweepRun(sweep_dir, parallel=at_once, log_level=log_level).run()
    return summarize(sweep_dir, test=test)
