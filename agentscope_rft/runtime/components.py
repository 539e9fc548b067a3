"""Building a run's components from its config, and the run folder's files."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentscope_rft.config import ConfigError, RunConfig, dump_config
from agentscope_rft.explorer.explorer import (
    EpisodeSettings,
    ExploreResult,
    default_max_tokens_per_call,
)
from agentscope_rft.files import replace_text
from agentscope_rft.monitor.records import drop_partial_last_line
from agentscope_rft.runtime.best import RUN_STATE_FILE
from agentscope_rft.types import JSON, Call, Rollout

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
CHECKPOINTS = "checkpoints"


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked (exists, or has nothing to resume)."""


def run_dir_for(config: RunConfig) -> Path:
    name = config.run.name or "run"
    if config.run.dir is None:
        logger.info("run.dir not set: using runs/%s", name)
    return Path(config.run.dir or Path("runs") / name)


def prepare_run_dir(config: RunConfig, run_dir: Path, *, resume: bool) -> RunFolderLock:
    """Create and lock the run folder (never silently replacing one) and save the resolved
    config; returns the lock, which the run holds until it ends.

    A new run may start in a folder holding only `explore` results (`explore-*/`, a baseline
    kept beside the run) and the `config.yaml` of a start that failed before any work.
    """
    lock = RunFolderLock(run_dir)
    try:
        _check_run_dir(config, run_dir, resume=resume)
        # (every resume writes it again: a kill mid-write must leave the old one, not half of it)
        partial = run_dir / "config.yaml.tmp"
        try:
            partial.write_text(dump_config(config))
            partial.replace(run_dir / "config.yaml")
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise unwritable(run_dir, exc) from exc
    except BaseException:
        lock.release()
        raise
    return lock


def unwritable(run_dir: Path, exc: OSError) -> RunFolderError:
    """The error of a run folder that cannot be written (a read-only or full disk, no
    permission), found before any work."""
    return RunFolderError(
        f"cannot write the run folder {run_dir}: {exc.strerror or exc}. Give the run a folder "
        "this user can write on a disk with room (--set run.dir=<folder>)"
    )


class RunFolderLock:
    """An exclusive lock on a run folder, held by the process that trains it (the system drops
    it when that process ends, killed included): a second `train` or `--resume` of the same
    folder would interleave its steps with the first's."""

    def __init__(self, run_dir: Path) -> None:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unwritable(run_dir, exc) from exc
        self._fd: int | None = os.open(run_dir, os.O_RDONLY)  # not inherited by children
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise RunFolderError(
                f"{run_dir} is in use by another `agentscope-rft train` (the run, or a resume "
                "of it, is still running): wait for it to end or stop it (Ctrl-C), then "
                f"`agentscope-rft train --resume {run_dir}`"
            ) from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _check_run_dir(config: RunConfig, run_dir: Path, *, resume: bool) -> None:
    if resume:
        if not (run_dir / STATE_FILE).is_file():
            raise RunFolderError(f"{run_dir} has no checkpoint to resume from ({STATE_FILE})")
        _check_resume_checkpoint(run_dir, int(read_state(run_dir)["step"]))
    elif files := _run_files(run_dir):
        if not config.run.overwrite:
            if (run_dir / STATE_FILE).is_file():
                raise RunFolderError(
                    f"run folder {run_dir} already exists: resume it with `agentscope-rft train "
                    f"--resume {run_dir}`, pick another run.name, or pass --set run.overwrite=true"
                )
            raise RunFolderError(
                f"run folder {run_dir} already exists with {', '.join(files[:4])} "
                "but no checkpoint to resume from: pick another run.name, or pass --set "
                "run.overwrite=true to replace it"
            )
        logger.warning("run.overwrite: replacing %s", run_dir)
        for child in run_dir.iterdir():  # the folder itself stays: it carries the lock
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def healthy_checkpoint(run_dir: Path, before: int, healthy: Callable[[int], bool]) -> int | None:
    """The newest whole checkpoint of a step before `before` whose policy broke no health rule
    (`healthy(step)`), or None."""
    for folder in sorted((run_dir / CHECKPOINTS).glob("step-*"), reverse=True):
        step = int(folder.name.removeprefix("step-"))
        if step < before and healthy(step) and (folder / RUN_STATE_FILE).exists():
            return step
    return None


def rollback_targets(
    run_dir: Path, before: int, restored: int | None, healthy: Callable[[int], bool]
) -> set[int]:
    """The checkpoints pruning keeps for rollbacks: the newest healthy one before `before`, the
    healthy one before it, and the healthy one before `restored` (the step the last rollback went
    back to): a problem found again from a policy a rollback restores needs an older one."""
    newest = healthy_checkpoint(run_dir, before, healthy)
    older = [healthy_checkpoint(run_dir, b, healthy) for b in (newest, restored) if b is not None]
    return {step for step in (newest, *older) if step is not None}


def _check_resume_checkpoint(run_dir: Path, step: int) -> None:
    """The checkpoint `state.json` names must be whole (its run state is written last), else
    the resume would fail deep in the trainer with an error that does not say why."""
    folder = checkpoint_dir(run_dir, step)
    if (folder / RUN_STATE_FILE).is_file():
        return
    whole = sorted(
        int(f.name.removeprefix("step-"))
        for f in (run_dir / CHECKPOINTS).glob("step-*")
        if (f / RUN_STATE_FILE).is_file()
    )
    what = "is incomplete (no run_state.json)" if folder.is_dir() else "is missing"
    raise RunFolderError(
        f"{run_dir / STATE_FILE} resumes after step {step}, but its checkpoint {folder} {what}; "
        f"whole checkpoints: {', '.join(map(str, whole)) or 'none'}. "
        + (
            f"Continue from one of them in a new run folder: `agentscope-rft train --config "
            f"{run_dir / 'config.yaml'} --set run.dir=<new folder> --fork-from {run_dir} "
            f"--fork-step {whole[-1]}`"
            if whole
            else f"Start again with `agentscope-rft train --config {run_dir / 'config.yaml'}`"
        )
    )


def _run_files(run_dir: Path) -> list[str]:
    """What in `run_dir` a new run would mix with (sorted names); none if it does not exist."""
    if not run_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in run_dir.iterdir()
        if p.name != "config.yaml" and not (p.is_dir() and p.name.startswith("explore-"))
    )


def episode_settings(config: RunConfig, max_model_len: int) -> EpisodeSettings:
    ex = config.explorer
    max_length = ex.max_sample_length or config.trainer.max_seq_len or max_model_len
    if ex.max_sample_length is None:
        logger.info("explorer.max_sample_length not set: using %d tokens", max_length)
    return EpisodeSettings(
        episode_timeout=ex.episode_timeout,
        max_retries=ex.max_retries,
        max_concurrency=ex.max_concurrency,
        model_stream=ex.stream,
        max_tokens=ex.sampling.max_tokens,
        reward_spread=ex.reward_spread,
        reward_gamma=ex.reward_gamma,
        success_threshold=ex.success_threshold,
        max_sample_length=max_length,
        late_call_grace=ex.late_call_grace,
        context_overflow_reward=ex.context_overflow_reward,
        agents=ex.agents,
    )


def max_tokens_per_call(config: RunConfig, max_model_len: int) -> int:
    """The gateway's cap on an episode call's completion tokens (logged when derived)."""
    ex = config.explorer
    if ex.max_tokens_per_call is not None:
        return ex.max_tokens_per_call
    limit = max(default_max_tokens_per_call(max_model_len), ex.sampling.max_tokens or 0)
    logger.info(
        "explorer.max_tokens_per_call not set: episode calls generate at most %d tokens", limit
    )
    return limit


def nominal_batch_size(config: RunConfig) -> int:
    """Samples per training step as configured (episodes that split into several samples, and
    dropped zero-variance groups, make real batches differ)."""
    if config.run.mode == "offline":
        pairs = 2 if config.offline.format == "dpo" else 1
        return config.offline.batch_size * pairs
    return config.explorer.tasks_per_step * config.explorer.group_size


def sampling_rules(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Gateway sampling overrides: training rollouts by default, `eval` rollouts greedy."""

    def values(section: Any) -> dict[str, Any]:
        return {k: v for k, v in section.model_dump().items() if v is not None}

    return {"": values(config.explorer.sampling), "eval": values(config.explorer.eval_sampling)}


@dataclass
class RolloutLog:
    """Appends one compact JSON line per rollout to `rollouts.jsonl` (for inspection).

    A batch's lines go out in one unbuffered write, so a killed run leaves whole lines (at worst a
    torn last one after a power loss, which a resumed run drops).
    """

    path: Path
    resume: bool = False

    def __post_init__(self) -> None:
        if self.resume:
            drop_partial_last_line(self.path)

    def write(self, step: int, phase: str, result: ExploreResult) -> None:
        text = "".join(json.dumps(rollout_line(step, phase, r)) + "\n" for r in result.rollouts)
        with open(self.path, "ab", buffering=0) as handle:
            handle.write(text.encode("utf-8"))


def rollout_line(step: int, phase: str, rollout: Rollout) -> dict[str, Any]:
    """The `rollouts.jsonl` record of one episode (also written by `serve --record`)."""
    return {
        "step": step,
        "phase": phase,
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "reward": rollout.reward,
        "success": rollout.success,
        "status": str(rollout.status),
        "truncated": rollout.truncated,
        "error": (rollout.error or "")[-1000:] or None,
        "metrics": dict(rollout.metrics),
        "attempts": rollout.attempts,
        "runner": rollout.runner,
        "calls": [
            {
                "agent": call.agent_name,
                "prompt_tokens": len(call.prompt_ids),
                "completion_tokens": len(call.completion_ids),
                "finish_reason": call.finish_reason,
                "content": call.content,
                "reasoning": _cut(call.reasoning) if call.reasoning else None,
                "tool_calls": [[t.name, t.arguments] for t in call.tool_calls],
                "policy_version": call.policy_version,
                "messages": messages,
            }
            for call, messages in zip(rollout.calls, new_messages(rollout.calls), strict=True)
        ],
    }


MESSAGE_CHARS = 4000
"""A logged message's text is cut to this many characters (the middle elided)."""


def new_messages(calls: list[Call]) -> list[list[list[str]]]:
    """Per call, the request messages that were new to it, as `[role, name, text]`.

    A call whose messages continue its agent's previous call (the same list, then that call's
    reply, then tool results or user turns) logs only what came after the reply; otherwise (the
    agent's first call, or a rewritten history) every message. So tool results and user turns
    are logged once, where they entered the conversation, without repeating system prompts.
    """
    last: dict[str | None, list[JSON]] = {}
    out = []
    for call in calls:
        before = last.get(call.agent_name)
        start = 0
        if before is not None and call.messages[: len(before)] == before:
            start = len(before)
            if start < len(call.messages) and call.messages[start].get("role") == "assistant":
                start += 1  # the previous call's own reply, shown with that call
        out.append([_message_row(m) for m in call.messages[start:]])
        last[call.agent_name] = call.messages
    return out


def _message_row(message: JSON) -> list[str]:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    text = _cut("" if content is None else str(content))
    return [str(message.get("role", "")), str(message.get("name") or ""), text]


def _cut(text: str) -> str:
    """`text`, its middle elided beyond `MESSAGE_CHARS` characters."""
    if len(text) <= MESSAGE_CHARS:
        return text
    half = MESSAGE_CHARS // 2
    return f"{text[:half]} [... {len(text) - MESSAGE_CHARS} characters ...] {text[-half:]}"


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    replace_text(run_dir / STATE_FILE, json.dumps(state, indent=1))


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunFolderError(f"cannot read {run_dir / STATE_FILE}: {exc}") from exc
    return state


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


def prune_checkpoints(run_dir: Path, keep: int, protect: set[int] | None = None) -> None:
    """Delete all but the newest `keep` step checkpoints, and those of the `protect` steps
    (`checkpoints/best` is no step checkpoint: never deleted).

    Only complete checkpoints count: a step folder whose writing a kill cut off (no run state)
    must not push the checkpoint that `state.json` names out of the newest `keep`. Such a folder
    older than the newest checkpoint is deleted; a newer one is written again when its step is.
    """
    folders = sorted((run_dir / CHECKPOINTS).glob("step-*"))
    complete = [f for f in folders if (f / RUN_STATE_FILE).is_file()]
    kept = {checkpoint_dir(run_dir, step) for step in protect or ()}
    cut_off = [f for f in folders if f not in complete and complete and f < complete[-1]]
    for old in [*complete[:-keep], *cut_off]:
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)


def drop_checkpoints_after(run_dir: Path, step: int) -> None:
    """Delete the step checkpoints after `step`: a rollback to `step` abandoned them (their
    policies broke a rule, or trained on from one that did); `<run>:last` or a fork must not
    take one for the run's. Their run state goes first, so a kill meanwhile leaves no whole
    one."""
    for folder in sorted((run_dir / CHECKPOINTS).glob("step-*")):
        if int(folder.name.removeprefix("step-")) > step:
            (folder / RUN_STATE_FILE).unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)


def load_resumed_config(run_dir: Path, overrides: list[str]) -> RunConfig:
    from agentscope_rft.config import load_config
    from agentscope_rft.config_paths import missing_run_folder

    config_file = run_dir / "config.yaml"
    missing = missing_run_folder(run_dir)
    if missing:
        raise RunFolderError(missing)
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} has no config.yaml to resume with")
    return load_config(config_file, overrides)


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started
