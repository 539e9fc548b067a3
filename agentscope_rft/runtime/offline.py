"""Offline training data (`run.mode: offline`): SFT or DPO samples from files, in batches."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.config import EXPLORING_MODES, RunConfig
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import Sample

if TYPE_CHECKING:
    from agentscope_rft.review.training import ReviewUse

logger = logging.getLogger(__name__)


OFFLINE_UNITS = "offline_units"
"""Run-state key: the offline units (samples, DPO pairs) the checkpoint's steps trained."""
OFFLINE_STREAM = "offline_stream"
"""Run-state key: what the offline order was drawn from (the seed, the units' fingerprint)."""


def offline_batches(
    config: RunConfig,
    start: int = 0,
    units: dict[str, list[Sample]] | None = None,
    *,
    saved: Mapping[str, Any] | None = None,
) -> OfflineBatches:
    """Endless shuffled batches of `offline.batch_size` samples (DPO: pairs), epoch by epoch.

    The file is read (and a bad one refused) when this is called, not at the first batch, unless
    `units` (from `load_offline_units`, read by the preflight checks) are given. The units come
    in one stream that depends only on `run.seed` and the file (one shuffle per epoch, one after
    another), and each batch is the stream's next `batch_size` units. A run resumed after step
    `start` goes on where it stopped: after the units it trained (`saved`, its checkpoint's run
    state), so a resume that changes `offline.batch_size` neither repeats nor skips a unit;
    without them (a checkpoint from before they were saved), after `start` batches of the
    configured size. The order stays the one the run drew: a resume with another `run.seed`
    keeps the checkpoint's seed for it (the epoch in progress is not reshuffled), and one whose
    `offline.path` holds other units starts them at a new epoch (said in a warning).

    Example:
        >>> batch = next(offline_batches(config))  # doctest: +SKIP
    """
    if units is None:
        units = load_offline_units(config)
    if config.offline.batch_size > len(units):
        unit = "pairs" if config.algorithm.objective == "dpo" else "samples"
        if config.offline.format == "review" and _review_use(config) == "rewards":
            unit = "rated groups"  # a group stays whole in a batch
        logger.info(
            "offline.batch_size %d is more than the %d %s of %s: each batch holds all %d",
            config.offline.batch_size,
            len(units),
            unit,
            config.offline.path,
            len(units),
        )
    saved = saved or {}
    consumed, stream = saved.get(OFFLINE_UNITS), saved.get(OFFLINE_STREAM) or {}
    seed = config.run.seed
    if stream and stream.get("units") != _fingerprint(units):
        logger.warning(
            "resume: %s holds other samples than the checkpoint's steps trained on (%d units "
            "trained); the new data starts at its first epoch",
            config.offline.path,
            consumed or 0,
        )
        consumed = 0
    elif stream and stream.get("seed") != seed:
        logger.info(
            "resume: the offline data keeps the order drawn with the run's run.seed %s (not %s): "
            "the epoch in progress is not reshuffled",
            stream["seed"],
            seed,
        )
        seed = stream["seed"]
    batches = OfflineBatches(units, config.offline.batch_size, random.Random(seed), seed=seed)
    if consumed is None:
        for _ in range(start):
            next(batches)
    else:
        batches.skip(consumed)
    return batches


def _fingerprint(units: Mapping[str, list[Sample]]) -> str:
    """The units' names (file and line, pair or group), which the order is a shuffle of."""
    return hashlib.sha256(json.dumps(sorted(units)).encode()).hexdigest()[:16]


def load_offline_units(config: RunConfig) -> dict[str, list[Sample]]:
    """`offline.path` read and rendered with the model's chat template, by unit: a DPO pair, an
    advantage group or one sample (a unit stays whole in a batch).

    Raises:
        OfflineDataError, ReviewDataError: a bad line, naming the file, the line and the field.

    Example:
        >>> units = load_offline_units(config)  # doctest: +SKIP
    """
    from agentscope_rft.buffer.offline import load_dpo_samples, load_sft_samples
    from agentscope_rft.engines.factory import read_chat_template
    from agentscope_rft.review.training import (
        check_rated_groups,
        load_review_samples,
    )

    assert config.offline.path is not None
    # The engine's template (`model.chat_template`), so demonstrations are trained in the token
    # layout the policy is later sampled in.
    renderer = ChatRenderer(
        load_tokenizer(resolve_model(config.model.name_or_path)),
        read_chat_template(config.model.chat_template),
    )
    if config.offline.format == "review":
        use = _review_use(config)
        samples = load_review_samples(
            config.offline.path, use, renderer.tokenizer, renderer.end_of_turn_id
        )
        if use == "rewards":
            check_rated_groups(config.offline.path, samples, config.algorithm.advantage)
        what = {"sft": "reviewed corrections", "dpo": "reviewed pairs", "rewards": "groups"}[use]
    else:
        load = load_dpo_samples if config.offline.format == "dpo" else load_sft_samples
        samples = load(config.offline.path, renderer, _max_sample_tokens(config))
        what = "pairs" if config.offline.format == "dpo" else "samples"
    units: dict[str, list[Sample]] = {}
    for sample in samples:
        # A unit stays whole in a batch: a DPO pair, an advantage group, or one sample.
        key = sample.pair_id or (sample.group if sample.kind == "rl" else sample.sample_id)
        units.setdefault(key or str(len(units)), []).append(sample)
    if config.data.offline_operators:
        from agentscope_rft.data.side import apply_offline_operators

        units = apply_offline_operators(
            config.data.offline_operators, units, renderer.tokenizer.decode
        )
    logger.info("offline data: %d %s from %s", len(units), what, config.offline.path)
    return units


def _review_use(config: RunConfig) -> ReviewUse:
    from agentscope_rft.review.training import review_use

    return review_use(config.algorithm.objective, config.run.mode in EXPLORING_MODES)


def _max_sample_tokens(config: RunConfig) -> tuple[int, str] | None:
    """The longest sample the run can train, and what sets it: `trainer.max_seq_len`, else the
    context window (`model.max_model_len`, at most the model's positions, as engines take it)."""
    if config.trainer.max_seq_len is not None:
        return config.trainer.max_seq_len, "trainer.max_seq_len"
    path = Path(resolve_model(config.model.name_or_path)) / "config.json"
    try:
        model_config = json.loads(path.read_text())
    except (OSError, ValueError):
        model_config = {}
    text = model_config.get("text_config") or model_config
    positions = text.get("max_position_embeddings")
    if not isinstance(positions, int) or text.get("rope_scaling"):
        positions = None  # with rope scaling the window is longer than the positions say
    wanted = config.model.max_model_len
    if wanted is not None and (positions is None or wanted <= positions):
        return wanted, "model.max_model_len"
    if positions is None:
        return None
    return positions, f"the model's context window: max_position_embeddings in {path}"


class OfflineBatches:
    """The batches of `offline_batches`; `consumed` counts the units handed out so far."""

    def __init__(
        self, units: dict[str, list[Sample]], batch_size: int, rng: random.Random, seed: int = 0
    ) -> None:
        self.units, self.batch_size, self.rng, self.seed = units, batch_size, rng, seed
        self.order = list(units)
        self.pending: list[str] = []  # the rest of the stream's shuffles drawn so far
        self.consumed = 0

    def __iter__(self) -> Iterator[list[Sample]]:
        return self

    def __next__(self) -> list[Sample]:
        if len(self.pending) < self.batch_size:
            self._draw_epoch()
        chosen = self.pending[: self.batch_size]
        del self.pending[: self.batch_size]
        self.consumed += len(chosen)
        return [s for key in chosen for s in self.units[key]]

    def state(self) -> dict[str, Any]:
        """What a checkpoint saves of the stream (`offline_batches(saved=...)` goes on from it)."""
        stream = {"seed": self.seed, "units": _fingerprint(self.units)}
        return {OFFLINE_UNITS: self.consumed, OFFLINE_STREAM: stream}

    def skip(self, units: int) -> None:
        """Pass over the first `units` units of the stream (what a resumed run trained)."""
        while len(self.pending) < units - self.consumed:
            self._draw_epoch()
        del self.pending[: units - self.consumed]
        self.consumed = units

    def _draw_epoch(self) -> None:
        shuffled = self.order[:]
        self.rng.shuffle(shuffled)
        self.pending += shuffled
