"""Reviews as training data: `offline.format: review` with `offline.path: runs/<name>`.

What a run takes from the reviewed run folder depends on its `algorithm.objective`:

- `sft` (and an exploring run's demonstrations: `offline.warmup_steps`, `sft_rl_mix`): each
  correction becomes an SFT sample: the call's prompt tokens exactly as the policy saw them
  (from `samples.jsonl`), then the corrected text and the end-of-turn token, trained;
- `dpo`: each preference becomes a pair (the chosen and the rejected episode's first sample,
  each trained on its sampled tokens), and each correction a pair of the corrected answer over
  the answer the policy gave;
- an RL objective (`rl`): every advantage group holding a rated episode is trained again with
  the reviewer's scores as rewards: an episode rating replaces the episode's whole reward (its
  outcome and any token rewards the run gave it), a call rating adds a reward at the end of that
  call; the group's unrated episodes keep theirs (one recorded without a reward, by `serve
  --record`, is left out: its reward is unknown, not 0).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentscope_rft.monitor.samples_file import SAMPLES_FILE, read_sample_lines
from agentscope_rft.review.store import Review, ReviewStore
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)

ReviewUse = Literal["sft", "dpo", "rewards"]
SAMPLE_FIELDS = frozenset(Sample.__dataclass_fields__)


class ReviewDataError(ValueError):
    """A reviewed run folder that gives no training data of the kind asked for."""


def review_use(objective: str, exploring: bool) -> ReviewUse:
    """What a run with `objective` takes from reviews (exploring runs: demonstrations)."""
    if exploring or objective == "sft":
        return "sft"
    return "dpo" if objective == "dpo" else "rewards"


def load_review_samples(
    run_dir: str | Path, use: ReviewUse, tokenizer: Any, end_of_turn_id: int | None = None
) -> list[Sample]:
    """Training samples from the reviews of `run_dir` (see the module docstring).

    A corrected answer ends with `end_of_turn_id`, the token the chat template closes an
    assistant turn with (`ChatRenderer.end_of_turn_id`; the tokenizer's eos when None), as the
    policy's own answers end.

    Raises:
        ReviewDataError: no reviews or no sample log in `run_dir`, or none of its reviews gives
            `use` data (the message says which kinds would).

    Example:
        >>> samples = load_review_samples("runs/quickstart", "rewards", tokenizer)  # doctest: +SKIP
    """
    run_dir = Path(run_dir)
    reviews = ReviewStore(run_dir).current()
    if not reviews:
        raise ReviewDataError(
            f"{run_dir} has no reviews ({run_dir / 'reviews.jsonl'}): review episodes in "
            f"`agentscope-rft dashboard {run_dir.parent}` first"
        )
    records = read_sample_lines(run_dir / SAMPLES_FILE)
    if not records:
        raise ReviewDataError(
            f"{run_dir} has no {SAMPLES_FILE}: the run was made with monitor.sample_log: 0 "
            "or before the sample log existed, so its episodes' tokens are not on disk"
        )
    by_id = {r["sample_id"]: r for r in records if r.get("phase") == "train"}
    turn = _TurnEnd(tokenizer, end_of_turn_id)
    if use == "sft":
        samples = [_corrected(r, by_id, turn) for r in reviews if r.kind == "correction"]
        wanted = "corrections (a corrected answer for a call)"
    elif use == "dpo":
        samples = [s for r in reviews for s in _pair(r, by_id, records, turn)]
        wanted = "preferences (the better of two episodes) or corrections"
    else:
        samples = _rated_groups([r for r in reviews if r.kind == "rating"], by_id, records)
        wanted = "ratings (a score or thumbs for an episode or call)"
    found = [s for s in samples if s is not None]
    _say_untrained(run_dir, reviews, use, records)
    if not found:
        raise ReviewDataError(
            f"{run_dir}: none of its {len(reviews)} reviews gives {use} data; it takes "
            f"{wanted} of episodes logged in {SAMPLES_FILE}"
        )
    return found


def check_rated_groups(run_dir: str | Path, samples: list[Sample], advantage: Any) -> None:
    """Refuse rated groups that a group-baseline estimator cannot learn from.

    An estimator such as GRPO or RLOO compares each episode with the others of its group; a
    group of one episode (live traffic answers each prompt once; a run with group_size 1) gets
    advantage 0, so rating such episodes alone would train nothing. Some singletons among
    larger groups are named in a warning.

    Raises:
        ReviewDataError: every rated group holds one episode (the message gives the fixes).
    """
    if not advantage.uses_group_baseline():
        return
    episodes: dict[str, set[str]] = defaultdict(set)
    for sample in samples:
        episodes[sample.group].add(sample.rollout_id)
    single = [group for group, ids in episodes.items() if len(ids) == 1]
    if not single:
        return
    why = (
        f"advantage {advantage.type!r} compares an episode with the others of its group (same "
        "task), so an episode alone in its group gets advantage 0"
    )
    if len(single) == len(episodes):
        raise ReviewDataError(
            f"{run_dir}: each of the {len(single)} rated group(s) holds one episode (live "
            f"traffic answers each prompt once), and {why}: nothing would train. Set "
            "algorithm.advantage: reinforce_plus_plus (its baseline is the batch: rewards are "
            "whitened over all the rated episodes), rate several answers to one task, or train "
            "corrections (algorithm.objective: sft) or preferences (algorithm.objective: dpo)"
        )
    logger.warning(
        "%s: %d of %d rated groups hold one episode and train nothing: %s (algorithm.advantage: "
        "reinforce_plus_plus uses the batch as baseline instead)",
        run_dir, len(single), len(episodes), why,
    )  # fmt: skip


def _say_untrained(
    run_dir: Path, reviews: list[Review], use: ReviewUse, records: list[dict[str, Any]]
) -> None:
    """Warn about the ratings and preferences of `use` that name episodes without a logged
    training sample: they are accepted by the dashboard but give no data."""
    trained = {r.get("rollout_id") for r in records if r.get("phase") == "train"}
    samples = {r.get("sample_id") for r in records if r.get("phase") == "train"}
    kind = {"rewards": "rating", "dpo": "preference"}.get(use)
    untrained = [
        r
        for r in reviews
        if r.kind == kind
        and (
            (r.sample_id is not None and r.sample_id not in samples)
            or not {r.rollout_id, r.chosen, r.rejected} - {None} <= trained
        )
    ]
    if untrained:
        named = [r.rollout_id or f"{r.chosen} over {r.rejected}" for r in untrained]
        logger.warning(
            "%s: %d %s review(s) are not trained on: their episodes have no training sample in "
            "%s (eval episodes, failed ones and those beyond monitor.sample_log have none): %s",
            run_dir,
            len(untrained),
            kind,
            SAMPLES_FILE,
            ", ".join(named[:10]) + (", ..." if len(named) > 10 else ""),
        )


def _sample(record: dict[str, Any], **changes: Any) -> Sample:
    fields = {k: v for k, v in record.items() if k in SAMPLE_FIELDS}
    if fields.get("reward") is None:  # an episode recorded without a reward (`serve --record`)
        fields["reward"] = 0.0
    return Sample(**{**fields, **changes})


def _call_span(review: Review, by_id: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], int, int]:
    record = by_id.get(review.sample_id or "")
    spans = record.get("call_spans") if record else None
    if record is None or not spans or review.call is None or review.call >= len(spans):
        raise ReviewDataError(
            f"review {review.id}: sample {review.sample_id!r} call {review.call} is not in the "
            f"run's {SAMPLES_FILE}"
        )
    start, end = spans[review.call]
    return record, int(start), int(end)


@dataclass(frozen=True)
class _TurnEnd:
    """The tokenizer, and the tokens that end an answer: the template's end of turn (written
    after a corrected answer) and the tokenizer's eos (a call may have stopped on either)."""

    tokenizer: Any
    end_of_turn_id: int | None

    @property
    def closing(self) -> int | None:
        eot = self.end_of_turn_id
        eos = self.tokenizer.eos_token_id
        return eot if eot is not None else (eos if isinstance(eos, int) else None)

    def stops(self, token: int) -> bool:
        return token in (self.end_of_turn_id, self.tokenizer.eos_token_id)


def _corrected(review: Review, by_id: dict[str, dict[str, Any]], turn: _TurnEnd) -> Sample:
    record, start, _ = _call_span(review, by_id)
    prompt = list(record["token_ids"][:start])
    answer = list(turn.tokenizer(review.text, add_special_tokens=False)["input_ids"])
    completion = [*answer, *([turn.closing] if turn.closing is not None else [])]
    sample_id = f"review:{review.id}"
    return Sample(
        token_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + [1] * len(completion),
        logprobs=[0.0] * (len(prompt) + len(completion)),
        reward=0.0,
        rollout_id=sample_id,
        task_id=str(record.get("task_id", "")),
        sample_id=sample_id,
        agent_name=record.get("agent_name"),
        kind="sft",
    )


def _pair(
    review: Review,
    by_id: dict[str, dict[str, Any]],
    records: list[dict[str, Any]],
    turn: _TurnEnd,
) -> list[Sample]:
    pair_id = f"review:{review.id}"
    if review.kind == "correction":
        chosen = _corrected(review, by_id, turn)
        record, start, end = _call_span(review, by_id)
        # The answer as the chosen side has it: up to its end-of-turn token, which a call that
        # stopped sampled itself; after a cut-off call it is the next token of the sample.
        ids = record["token_ids"]
        stopped = turn.stops(ids[end - 1])
        length = end + (1 if end < len(ids) and not stopped else 0)
        rejected = _sample(
            record,
            token_ids=record["token_ids"][:length],
            loss_mask=[0] * start + [1] * (length - start),
            logprobs=[0.0] * length,
            token_rewards=None,
            step_states=None,
            num_calls=1,
        )
    elif review.kind == "preference":
        first: dict[str, dict[str, Any]] = {}
        for r in records:
            if r.get("phase") == "train":
                first.setdefault(r["rollout_id"], r)
        if review.chosen not in first or review.rejected not in first:
            return []
        chosen, rejected = (_sample(first[rid]) for rid in (review.chosen, review.rejected))
    else:
        return []
    return [
        Sample(**{**_fields(s), "kind": kind, "pair_id": pair_id, "sample_id": f"{pair_id}:{side}"})
        for s, kind, side in ((chosen, "dpo_chosen", "chosen"), (rejected, "dpo_rejected", "rej"))
    ]


def _fields(sample: Sample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in SAMPLE_FIELDS}


def _rated_groups(
    ratings: list[Review], by_id: dict[str, dict[str, Any]], records: list[dict[str, Any]]
) -> list[Sample]:
    episode_score = {r.rollout_id: r.score for r in ratings if r.sample_id is None}
    call_scores: dict[str, dict[int, float]] = defaultdict(dict)
    for r in ratings:
        if r.sample_id is not None and r.call is not None and r.score is not None:
            call_scores[r.sample_id][r.call] = r.score
    rated = set(episode_score) | {by_id[sid]["rollout_id"] for sid in call_scores if sid in by_id}
    groups = {
        (r["step"], r.get("group_id") or r["task_id"])
        for r in records
        if r.get("phase") == "train" and r["rollout_id"] in rated
    }
    out: list[Sample] = []
    for record in records:
        key = (record["step"], record.get("group_id") or record["task_id"])
        if record.get("phase") != "train" or key not in groups:
            continue
        rated_episode = record["rollout_id"] in episode_score
        unknown = record.get("reward") is None and record["sample_id"] not in call_scores
        if unknown and not rated_episode:
            continue  # recorded without a reward (live traffic) and not rated: no reward known
        reward = episode_score[record["rollout_id"]] if rated_episode else record["reward"]
        # The reviewer's score is the rated episode's whole reward: the run's token rewards
        # (its reward spread over calls, emitted step rewards) would be counted on top of it.
        token_rewards = None if rated_episode else record.get("token_rewards")
        scores = call_scores.get(record["sample_id"], {})
        if scores:
            token_rewards = list(token_rewards or [0.0] * len(record["token_ids"]))
            for call, score in scores.items():
                if call < len(record["call_spans"]):
                    token_rewards[record["call_spans"][call][1] - 1] += score
        out.append(
            _sample(
                record,
                reward=float(reward if reward is not None else 0.0),
                token_rewards=token_rewards,
                group_id=f"review:{key[0]}:{key[1]}",
            )
        )
    return out
