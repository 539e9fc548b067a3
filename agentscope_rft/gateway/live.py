"""`serve --record <folder>`: live traffic as episodes, in the layout a run folder has.

Each finished rollout of `/rollouts/<id>/v1` becomes one episode: a line in `rollouts.jsonl` and
its training samples in `samples.jsonl` (exact token ids, loss masks, log-probs and policy
versions, built by the explorer's `build_samples` and written by the run's own line makers), so
`agentscope-rft dashboard` lists and reviews it like a run's episodes and `train` with
`offline.format: review` trains on its reviews. `config.yaml` names the model that served.

A rollout finishes with `POST /rollouts/<id>/end` (body, all optional: `{"reward": r, "task":
{...}, "grace": s}`), or when it has been idle for the recorder's `max_age` (or is pushed out by
its count or memory bound): it is then written without a reward. Either way its id is closed
(later calls under it get 410). A reward, at the end or posted later with `POST
/rollouts/<id>/reward` (`{"reward": r}`: production feedback arrives late), is stored as an
episode rating by reviewer `app` in `reviews.jsonl`, which is what review training reads; a
later rating of the episode (the app's or a reviewer's in the dashboard) supersedes it.

Episodes of one task form one advantage group: the task is the `task`'s `id` (or `task_id`)
when the app sends one, else the first prompt the episode's model saw, so answers to one prompt
are compared with each other. Lines are appended and fsynced (samples before the episode's line),
so a crash of `serve` loses no finished episode; a torn last line is dropped when `serve
--record` starts on the folder again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentscope_rft.dashboard.runs import iter_jsonl
from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.gateway.app import (
    GatewayState,
    _check_auth,
    _check_rollout_id,
    close_rollout,
)
from agentscope_rft.gateway.protocol import RequestError
from agentscope_rft.monitor.records import drop_partial_last_line
from agentscope_rft.monitor.samples_file import SAMPLES_FILE
from agentscope_rft.review.store import Review, ReviewStore
from agentscope_rft.runtime.components import rollout_line
from agentscope_rft.runtime.sample_log import break_reasons, sample_line
from agentscope_rft.types import JSON, Call, Rollout

logger = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.jsonl"
APP_REVIEWER = "app"
"""The reviewer name of the ratings that rewards posted by the app become."""
RECORDED_BY = "agentscope-rft serve --record"
"""`config.yaml`'s mark of a recording folder (a run's config has none)."""
PHASE = "train"
"""The phase of recorded episodes (review training reads the `train` phase)."""


class LiveRecording:
    """Writes the finished rollouts of a gateway as episodes under `folder`.

    Args:
        folder: The recording folder (created; an earlier recording of the same model goes on).
        model: The model that serves (`config.yaml` names it; the dashboard decodes with it).
        chat_template: The `--chat-template` served with, if any.

    Raises:
        ValueError: `folder` holds a recording (or run) of another model.

    Example:
        >>> recording = LiveRecording(Path("traffic"), "runs/quickstart:best")  # doctest: +SKIP
        >>> recording.bind(gateway.state)  # doctest: +SKIP
    """

    def __init__(self, folder: Path, model: str, chat_template: str | None = None) -> None:
        self.folder = folder
        model = _model_name(model)
        if chat_template and chat_template.endswith(".jinja") and Path(chat_template).is_file():
            chat_template = Path(chat_template).read_text()  # the text: the folder may move
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--record {folder}: that is a file; give a folder")
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "config.yaml"
        if config.is_file():
            try:
                written = yaml.safe_load(config.read_text()) or {}
                earlier = written.get("model", {})
            except (yaml.YAMLError, AttributeError) as exc:
                raise ValueError(
                    f"--record {folder}: its config.yaml does not parse: {exc}"
                ) from exc
            if written.get("recorded_by") != RECORDED_BY:
                raise ValueError(
                    f"--record {folder} is a run folder (its config.yaml is a run's), not a "
                    "recording: its episodes and live ones would mix; record to a new folder"
                )
            if _model_name(str(earlier.get("name_or_path"))) != model:
                raise ValueError(
                    f"--record {folder} holds episodes of model {earlier.get('name_or_path')!r}, "
                    f"not {model!r}: their tokens belong to that model; record to a new folder"
                )
            if earlier.get("chat_template") != chat_template:
                raise ValueError(
                    f"--record {folder} holds episodes served with "
                    + ("another --chat-template" if earlier.get("chat_template") else "the "
                       "model's own chat template")
                    + " (its config.yaml's model.chat_template): their prompts were rendered "
                    "with it, and one folder of two templates would describe half its episodes "
                    "wrongly; serve with the same template, or record to a new folder"
                )  # fmt: skip
        else:
            data = {
                "model": {"name_or_path": model, "chat_template": chat_template},
                "recorded_by": RECORDED_BY,
            }
            config.write_text(yaml.safe_dump(data, sort_keys=False))
        for name in (ROLLOUTS_FILE, SAMPLES_FILE):
            drop_partial_last_line(folder / name)
        self.episodes = _episode_ids(folder / ROLLOUTS_FILE)
        """Rollout ids written here (this and earlier `serve` processes)."""
        self.reviews = ReviewStore(folder)
        self._state: GatewayState | None = None

    def bind(self, state: GatewayState) -> None:
        """Write the rollouts the gateway's recorder evicts (idle ones), and refuse new calls
        under the ids already written (an episode is written once)."""
        self._state = state
        state.recorder.on_evict = self._evicted
        # Every id written, however many: the gateway's own closed ids are bounded, and an id
        # it forgot would otherwise record a second episode under it.
        state.sealed = _Written(self.episodes, f"recorded in {self.folder}")

    def flush(self) -> int:
        """Write every rollout still open (`serve` stopping); returns how many."""
        if self._state is None:
            return 0
        recorder = self._state.recorder
        open_ids = list(recorder.rollout_ids)
        for rollout_id in open_ids:
            self.write(rollout_id, recorder.calls(rollout_id), ended="shutdown")
            recorder.discard(rollout_id)
        return len(open_ids)

    def _evicted(self, rollout_id: str, calls: list[Call], reason: str) -> None:
        if self._state is not None:
            self._state.close_rollout(rollout_id, f"ended after the {reason} limit")
        self.write(rollout_id, calls, ended=reason)

    def write(
        self,
        rollout_id: str,
        calls: list[Call],
        *,
        reward: float | None = None,
        task: JSON | None = None,
        ended: str = "end",
    ) -> JSON:
        """Append one episode (its samples, then its line) and its reward as a rating."""
        task = task or {}
        task_id = task_key(task, calls)
        rollout = Rollout(
            rollout_id=rollout_id,
            task_id=task_id,
            task=task,
            calls=calls,
            reward=0.0 if reward is None else reward,
            started_at=min(c.started_at for c in calls),
            finished_at=max(c.finished_at for c in calls),
        )
        samples, _ = build_samples(rollout, group_id=f"live:{task_id}")
        breaks = break_reasons(samples)
        sample_lines = [sample_line(0, PHASE, s, None, breaks.get(s.sample_id)) for s in samples]
        for record in sample_lines:
            record["reward"] = reward  # null without one: review training leaves it out
        sample_text = "".join(json.dumps(record) + "\n" for record in sample_lines)
        line = rollout_line(0, PHASE, rollout)
        line.update(reward=reward, task=task, ended=ended)
        _append(self.folder / SAMPLES_FILE, sample_text)
        _append(self.folder / ROLLOUTS_FILE, json.dumps(line) + "\n")
        self.episodes.add(rollout_id)
        if reward is not None:
            self.rate(rollout_id, reward, task_id)
        logger.info(
            "recorded episode %s (%s): %d calls, %d samples, reward %s",
            rollout_id, ended, len(calls), len(samples), reward,
        )  # fmt: skip
        return {
            "rollout_id": rollout_id,
            "task_id": task_id,
            "calls": len(calls),
            "samples": len(samples),
            "reward": reward,
        }

    def rate(self, rollout_id: str, reward: float, task_id: str | None = None) -> Review:
        """Store `reward` as the app's rating of a written episode."""
        review = Review(
            kind="rating",
            rollout_id=rollout_id,
            score=reward,
            task_id=task_id,
            reviewer=APP_REVIEWER,
        )
        return self.reviews.append(review)


def _model_name(model: str) -> str:
    """A model folder as its absolute path (`serve` ran in some folder; the dashboard and a later
    `serve --record` on the recording run elsewhere), a model name as given."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


class _Written(Mapping[str, str]):
    """The written rollout ids (a live view of the set), each closed for `reason`."""

    def __init__(self, ids: set[str], reason: str) -> None:
        self._ids, self._reason = ids, reason

    def __getitem__(self, rollout_id: str) -> str:
        if rollout_id not in self._ids:
            raise KeyError(rollout_id)
        return self._reason

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


def _episode_ids(path: Path) -> set[str]:
    """The rollout ids of a `rollouts.jsonl`, read a line at a time (a long recording's file
    is not held in memory); a torn or foreign line is skipped."""
    return {
        line["rollout_id"] for line in iter_jsonl(path) if isinstance(line.get("rollout_id"), str)
    }


def task_key(task: JSON, calls: list[Call]) -> str:
    """The task id of an episode: the app's (`id` or `task_id`), else a hash of the task, else
    of the first prompt (the messages of the episode's first call)."""
    for key in ("id", "task_id"):
        if isinstance(task.get(key), str | int) and not isinstance(task.get(key), bool):
            return str(task[key])
    first = min(calls, key=lambda c: (c.started_at, c.choice_index))
    source = task or {"messages": first.messages, "tools": first.tools}
    digest = hashlib.sha256(json.dumps(source, sort_keys=True, default=str).encode())
    return ("task-" if task else "prompt-") + digest.hexdigest()[:12]


def _append(path: Path, text: str) -> None:
    with open(path, "ab") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def _body(raw: bytes, allowed: set[str], usage: str) -> dict[str, Any]:
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}; send {usage}") from exc
    if not isinstance(data, dict):
        raise RequestError(f"the body must be a JSON object: {usage}")
    unknown = set(data) - allowed
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(sorted(unknown))}: send {usage}")
    return data


def _reward(data: dict[str, Any], usage: str, required: bool) -> float | None:
    reward = data.get("reward")
    if reward is None and not required:
        return None
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise RequestError(
            f"`reward` must be a finite number, got {reward!r}: send {usage}", param="reward"
        )
    return float(reward)


END_USAGE = '{"reward": number, "task": {...}, "grace": seconds} (each optional)'
REWARD_USAGE = '{"reward": number}'


def _not_found(rollout_id: str, why: str) -> RequestError:
    return RequestError(
        f"no rollout {rollout_id!r} {why}",
        status=404,
        kind="not_found_error",
        code="rollout_not_found",
    )


def add_live_routes(app: FastAPI, state: GatewayState, recording: LiveRecording) -> None:
    """`POST /rollouts/{id}/end` and `POST /rollouts/{id}/reward` (see the module docstring)."""
    recording.bind(state)

    @app.post("/rollouts/{rollout_id}/end")
    async def end(rollout_id: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        _check_rollout_id(rollout_id)
        data = _body(await request.body(), {"reward", "task", "grace"}, END_USAGE)
        reward = _reward(data, END_USAGE, required=False)
        task, grace = data.get("task") or {}, data.get("grace", 0.0)
        if not isinstance(task, dict):
            raise RequestError(f"`task` must be a JSON object: send {END_USAGE}", param="task")
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 600:
            raise RequestError("`grace` must be a number of seconds in [0, 600]", param="grace")
        if rollout_id in recording.episodes:
            raise RequestError(
                f"rollout {rollout_id!r} has ended already (it is in {recording.folder}); post a "
                f"late reward to /rollouts/{rollout_id}/reward",
                status=409,
                code="rollout_ended",
            )
        recorder = state.recorder
        if not recorder.calls(rollout_id) and not recorder.in_flight(rollout_id):
            raise _not_found(
                rollout_id,
                f"to end: no call was recorded under it (send its calls to the base URL "
                f"/rollouts/{rollout_id}/v1; a rollout idle past the bound is written by itself)",
            )
        await close_rollout(state, rollout_id, reason="ended", grace=float(grace))
        calls = await recorder.take(rollout_id)
        if not calls:
            raise _not_found(rollout_id, "to end: its calls in flight were aborted, none finished")
        return JSONResponse(recording.write(rollout_id, calls, reward=reward, task=task))

    @app.post("/rollouts/{rollout_id}/reward")
    async def late_reward(rollout_id: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        _check_rollout_id(rollout_id)
        data = _body(await request.body(), {"reward"}, REWARD_USAGE)
        reward = _reward(data, REWARD_USAGE, required=True)
        assert reward is not None
        if rollout_id not in recording.episodes:
            if state.recorder.calls(rollout_id) or state.recorder.in_flight(rollout_id):
                raise RequestError(
                    f"rollout {rollout_id!r} has not ended yet: end it with its reward (POST "
                    f"/rollouts/{rollout_id}/end)",
                    status=409,
                    code="rollout_not_ended",
                )
            raise _not_found(rollout_id, f"in {recording.folder}: no episode was recorded under it")
        review = recording.rate(rollout_id, reward)
        return JSONResponse({"rollout_id": rollout_id, "reward": reward, "review_id": review.id})


def add_unrecording_routes(app: FastAPI, state: GatewayState) -> None:
    """`/end` and `/reward` on a `serve` without `--record`: a 404 that says how to record."""

    async def refuse(rollout_id: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        raise RequestError(
            f"{request.url.path}: this server records no episodes; start `agentscope-rft serve` "
            "with --record <folder> to write finished rollouts there",
            status=404,
            kind="not_found_error",
            code="not_recording",
        )

    app.post("/rollouts/{rollout_id}/end")(refuse)
    app.post("/rollouts/{rollout_id}/reward")(refuse)
