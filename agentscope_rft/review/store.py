"""`reviews.jsonl`: a run's human reviews, one JSON object per line, append-only.

A review is one of:

- `rating`: a score for an episode (`rollout_id`) or for one call of it (`sample_id` + `call`,
  the index of the call's completion within that training sample); `thumbs` up/down is score
  1/0;
- `correction`: the answer the call should have given (`sample_id` + `call` + `text`);
- `preference`: the better (`chosen`) and worse (`rejected`) of two episodes of one task.

Every review can carry a `comment` and a `reviewer`. Lines are appended under an exclusive
file lock and fsynced, so concurrent writers never interleave and a crash loses no accepted
review; a torn last line (a writer killed mid-write) is skipped by readers and ended by the
next writer, so the review appended after it is kept. A later review of the
same target (same kind, episode, sample and call; or the same pair) supersedes an earlier one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

logger = logging.getLogger(__name__)

REVIEWS_FILE = "reviews.jsonl"


class ReviewError(ValueError):
    """A review that cannot be stored (the message names the field and the fix)."""


class Review(BaseModel):
    """One human review (see the module docstring for the kinds).

    Example:
        >>> Review(kind="rating", rollout_id="s3-t1-0", thumbs="up").score
        1.0
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rating", "correction", "preference"]
    """What the review says: a score, a corrected answer, or a pick between two episodes."""
    rollout_id: str | None = None
    """The episode reviewed (rating, correction)."""
    sample_id: str | None = None
    """The training sample holding the call (a call rating, a correction)."""
    call: int | None = Field(default=None, ge=0, strict=True)
    """Index of the call's completion within `sample_id` (0: its first call)."""
    score: float | None = Field(default=None, strict=True)
    """Rating: the reward the reviewer gives (any finite number; thumbs give 1 or 0)."""
    thumbs: Literal["up", "down"] | None = None
    """Rating: thumbs up (score 1) or down (score 0)."""
    text: str | None = Field(default=None, max_length=100_000)
    """Correction: the answer the call should have given."""
    chosen: str | None = None
    """Preference: the better episode's rollout id."""
    rejected: str | None = None
    """Preference: the worse episode's rollout id."""
    task_id: str | None = None
    """The task of the episode(s), for reading the export."""
    comment: str = Field(default="", max_length=10_000)
    """Free text."""
    reviewer: str = Field(default="", max_length=200)
    """Who reviewed."""
    id: str = ""
    """Set when stored."""
    time: float = 0.0
    """Unix seconds; set when stored."""

    @model_validator(mode="after")
    def _complete(self) -> Review:
        if self.kind == "rating":
            if self.rollout_id is None:
                raise ValueError("a rating needs `rollout_id` (the episode rated)")
            if self.thumbs is not None:
                thumbs_score = 1.0 if self.thumbs == "up" else 0.0
                if self.score is not None and self.score != thumbs_score:
                    raise ValueError(
                        f"a rating gives `score` {self.score} and `thumbs` {self.thumbs!r} "
                        f"(score {thumbs_score:g}): give one of them"
                    )
                self.score = thumbs_score
            if self.score is None or not math.isfinite(self.score):
                raise ValueError("a rating needs a finite `score` or `thumbs` ('up'/'down')")
            if (self.call is None) != (self.sample_id is None):
                raise ValueError("a call rating needs both `sample_id` and `call`")
        elif self.kind == "correction":
            if self.rollout_id is None or self.sample_id is None or self.call is None:
                raise ValueError("a correction needs `rollout_id`, `sample_id` and `call`")
            if not (self.text or "").strip():
                raise ValueError("a correction needs `text`: the answer the call should give")
        else:
            if not self.chosen or not self.rejected or self.chosen == self.rejected:
                raise ValueError("a preference needs two different episodes: chosen, rejected")
        return self

    def target(self) -> tuple[Any, ...]:
        """What the review is about: a later review of the same target supersedes it."""
        if self.kind == "preference":
            return (self.kind, *sorted((self.chosen or "", self.rejected or "")))
        return (self.kind, self.rollout_id, self.sample_id, self.call)


def parse_review(data: dict[str, Any]) -> Review:
    """Validate a review as sent (its id and time are set when stored).

    Raises:
        ReviewError: a field is missing or wrong (named in the message).

    Example:
        >>> parse_review({"kind": "rating", "rollout_id": "s0.1", "thumbs": "down"}).score
        0.0
    """
    try:
        return Review.model_validate({**data, "id": "", "time": 0.0})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'review'}: {e['msg']}" for e in exc.errors()
        )
        raise ReviewError(f"review not stored: {problems}") from None


class ReviewStore:
    """The reviews of one run folder.

    Example:
        >>> store = ReviewStore(Path("runs/quickstart"))  # doctest: +SKIP
        >>> review = store.add({"kind": "rating", "rollout_id": "s0-t3-1", "score": 0.5})
        ...  # doctest: +SKIP
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / REVIEWS_FILE

    def add(self, data: dict[str, Any]) -> Review:
        """Validate and append one review; returns it with its id and time.

        Raises:
            ReviewError: a field is missing or wrong (named in the message).
        """
        return self.append(parse_review(data))

    def append(self, review: Review) -> Review:
        """Append a validated review; returns it with its id and time."""
        review.id = uuid.uuid4().hex[:12]
        review.time = round(time.time(), 3)
        line = (review.model_dump_json() + "\n").encode("utf-8")
        with open(self.path, "ab+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                # A writer killed mid-line left a torn last line: end it, or this review would
                # be glued to it and lost with it.
                if handle.seek(0, os.SEEK_END) > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        line = b"\n" + line
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return review

    def all(self) -> list[Review]:
        """Every stored review in order (lines that do not parse are skipped: a torn last line;
        one before it, a hand edit, is named in a warning)."""
        if not self.path.is_file():
            return []
        reviews: list[Review] = []
        lines = self.path.read_bytes().splitlines()
        skipped = []
        for number, line in enumerate(lines, start=1):
            try:
                reviews.append(Review.model_validate(json.loads(line.decode("utf-8"))))
            except (UnicodeDecodeError, json.JSONDecodeError, ValidationError):
                if number < len(lines) and line.strip():
                    skipped.append(number)
        if skipped:
            logger.warning(
                "%s: line(s) %s are not reviews (not UTF-8 JSON of a review) and are skipped; "
                "fix or delete them",
                self.path,
                ", ".join(map(str, skipped[:10])),
            )
        return reviews

    def current(self) -> list[Review]:
        """The reviews in force: the latest per target, in the order they were first given."""
        latest: dict[tuple[Any, ...], Review] = {}
        for review in self.all():
            latest[review.target()] = review
        return list(latest.values())
