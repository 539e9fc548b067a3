"""A run's episodes (`rollouts.jsonl`) and one episode in full: its calls, and its training
samples (`samples.jsonl`) token by token, decoded with the run's tokenizer."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from agentscope_rft.dashboard.runs import RunRef, flat_config, read_jsonl
from agentscope_rft.monitor.samples_file import SAMPLES_FILE, latest_per_key, read_sample_lines
from agentscope_rft.review.store import Review, ReviewError, ReviewStore

logger = logging.getLogger(__name__)

MAX_EPISODES = 5000
"""Episodes listed per request (the latest ones); filter by step or phase to see others."""


class EpisodeNotFound(LookupError):
    """A rollout id that is not in the run's `rollouts.jsonl`."""


def episode_summary(line: dict[str, Any]) -> dict[str, Any]:
    calls = _calls(line)
    error = line.get("error")
    return {
        "step": line.get("step"),
        "phase": line.get("phase"),
        "rollout_id": line.get("rollout_id"),
        "task_id": line.get("task_id"),
        "reward": line.get("reward"),
        "success": line.get("success"),
        "status": line.get("status"),
        "error": (str(error) if error else "")[-300:] or None,
        "agents": sorted({str(c.get("agent") or "-") for c in calls}),
        "calls": len(calls),
        "length": sum(_count(c.get("completion_tokens")) for c in calls),
    }


def _calls(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's calls; a hand-edited line's entries that are not calls are left out."""
    calls = line.get("calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def list_episodes(ref: RunRef, step: int | None = None, phase: str | None = None) -> dict[str, Any]:
    """Summaries of the run's episodes (optionally of one step and phase), reviews marked."""
    lines = _rollouts(ref)
    picked = [
        line
        for line in lines
        if (step is None or line.get("step") == step)
        and (phase is None or line.get("phase") == phase)
    ]
    reviewed = {r.rollout_id for r in ReviewStore(ref.path).current()} | {
        rid for r in ReviewStore(ref.path).current() for rid in (r.chosen, r.rejected) if rid
    }
    episodes = [episode_summary(line) for line in picked[-MAX_EPISODES:]]
    for episode in episodes:
        episode["reviewed"] = episode["rollout_id"] in reviewed
    return {"id": ref.id, "total": len(picked), "episodes": episodes}


def _rollouts(ref: RunRef) -> list[dict[str, Any]]:
    """The run's episodes, the last line of each rollout id; a line without a string
    `rollout_id` (a hand edit) cannot be addressed and is left out."""
    lines = read_jsonl(ref.path / "rollouts.jsonl")
    return latest_per_key([x for x in lines if isinstance(x.get("rollout_id"), str)], "rollout_id")


def find_episode(ref: RunRef, rollout_id: str) -> dict[str, Any]:
    for line in _rollouts(ref):
        if line.get("rollout_id") == rollout_id:
            return line
    raise EpisodeNotFound(f"no episode {rollout_id!r} in run {ref.id!r} (rollouts.jsonl)")


def check_review_targets(ref: RunRef, review: Review) -> None:
    """Refuse a review of what the run does not hold: an episode not in `rollouts.jsonl`, a
    call not in the episode's samples, a preference between episodes of different tasks.

    Raises:
        ReviewError: naming the field and what the run holds instead.
    """
    episodes = {line.get("rollout_id"): line for line in _rollouts(ref)}
    for field in ("rollout_id", "chosen", "rejected"):
        rollout_id = getattr(review, field)
        if rollout_id is not None and rollout_id not in episodes:
            raise ReviewError(
                f"review not stored: {field}: no episode {rollout_id[:200]!r} in run {ref.id!r} "
                "(rollouts.jsonl); pick one the Episodes tab lists"
            )
    if review.kind == "preference":
        tasks = {episodes[rid].get("task_id") for rid in (review.chosen, review.rejected)}
        if len(tasks) > 1:
            raise ReviewError(
                "review not stored: chosen and rejected are episodes of different tasks "
                f"({' and '.join(sorted(map(str, tasks)))}); compare two answers to one task"
            )
    if review.sample_id is None or review.call is None:
        return
    samples = read_sample_lines(ref.path / SAMPLES_FILE, review.rollout_id)
    sample = next((s for s in samples if s.get("sample_id") == review.sample_id), None)
    if sample is None or sample.get("rollout_id") != review.rollout_id:
        raise ReviewError(
            f"review not stored: sample_id: no sample {review.sample_id[:200]!r} of episode "
            f"{review.rollout_id!r} in samples.jsonl"
        )
    calls = len(sample.get("call_spans") or [])
    if review.call >= calls:
        raise ReviewError(
            f"review not stored: call: sample {review.sample_id!r} has {calls} call(s) "
            f"(0 to {calls - 1}), not call {review.call}"
        )


def episode_detail(ref: RunRef, rollout_id: str) -> dict[str, Any]:
    """One episode: its calls in order and its training samples with decoded tokens."""
    line = find_episode(ref, rollout_id)
    line = {**line, "calls": _calls(line)}
    samples = read_sample_lines(ref.path / SAMPLES_FILE, rollout_id)
    decode = _decoder(ref.path)
    for sample in samples:
        sample["tokens"] = decode(sample.get("token_ids") or [])
    siblings = [
        episode_summary(other)
        for other in _rollouts(ref)
        if other.get("task_id") == line.get("task_id")
        and other.get("step") == line.get("step")
        and other.get("phase") == line.get("phase")
        and other.get("rollout_id") != rollout_id
    ]
    reviews = [
        r.model_dump()
        for r in ReviewStore(ref.path).current()
        if rollout_id in (r.rollout_id, r.chosen, r.rejected)
    ]
    return {
        "id": ref.id,
        "episode": line,
        "samples": samples,
        "samples_logged": (ref.path / SAMPLES_FILE).is_file(),
        "same_task": siblings,
        "reviews": reviews,
    }


def _decoder(run_dir: Path) -> Any:
    model = flat_config(run_dir).get("model.name_or_path")
    tokenizer = _tokenizer(str(model)) if model else None
    if tokenizer is None:
        return lambda ids: [f"<{i}>" for i in ids]
    return lambda ids: [tokenizer.decode([i]) for i in ids]


@functools.lru_cache(maxsize=8)
def _tokenizer(model: str) -> Any:
    """The run's tokenizer, or None when it cannot be loaded here (ids are shown instead)."""
    try:
        from agentscope_rft.models import load_tokenizer, resolve_model

        return load_tokenizer(resolve_model(model))
    except Exception as exc:  # any failure only costs the token text
        logger.warning("cannot load the tokenizer of %s (%s): showing token ids", model, exc)
        return None


def export_reviews(ref: RunRef) -> list[dict[str, Any]]:
    """The run's reviews in force, each with its episode's context (step, phase, task, reward,
    and for a call review the call's sampled text)."""
    episodes = {line.get("rollout_id"): line for line in _rollouts(ref)}
    out: list[dict[str, Any]] = []
    for review in ReviewStore(ref.path).current():
        record: dict[str, Any] = {"run": ref.id, **review.model_dump()}
        for key in ("rollout_id", "chosen", "rejected"):
            episode = episodes.get(getattr(review, key))
            if episode is not None:
                record[f"{key}_episode"] = {
                    k: episode.get(k) for k in ("step", "phase", "task_id", "reward", "status")
                }
        if review.sample_id is not None and review.call is not None:
            samples = read_sample_lines(ref.path / SAMPLES_FILE, review.rollout_id)
            for sample in samples:
                spans = sample.get("call_spans") or []
                if sample.get("sample_id") == review.sample_id and review.call < len(spans):
                    start, end = spans[review.call]
                    record["original"] = _decoder(ref.path)(sample["token_ids"][start:end])
                    record["original"] = "".join(record["original"])
        out.append(record)
    return out
