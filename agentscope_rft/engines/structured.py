"""Structured outputs: OpenAI `response_format` as a token mask from a grammar (llguidance).

`json_object` constrains a completion to one JSON object, `json_schema` to JSON valid against the
given schema (as OpenAI and vLLM define them; `text` is no constraint). `grammar_for` checks a
`response_format` and compiles it once (the gateway calls it to answer a bad schema with a 400
that names the problem); each sampled sequence then walks its own `llguidance.LLMatcher`, and
before every sampling step `GrammarMask.apply` sets the logits of the tokens the grammar forbids
to -inf. The end-of-sequence token is allowed only where the grammar accepts, and once the JSON is
complete it is the only token allowed, so a constrained completion ends with it like any other.

Why llguidance (over xgrammar and outlines-core): an abi3 wheel with no dependencies that reads HF
tokenizers directly, builds the mask per step lazily (no per-schema precompilation over the whole
vocabulary, so a new schema costs about nothing), rejects JSON-schema keywords it does not
implement instead of ignoring them, and is one of vLLM's structured-output backends (the same
library, pinned to the version vLLM 0.32 installs).

Whitespace: JSON is generated compact (no optional whitespace between tokens). vLLM allows
flexible whitespace by default; a small model given that freedom can emit newlines until
`max_tokens` runs out, and compact JSON parses the same.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import numpy as np
import torch
from llguidance import LLMatcher
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FORMAT_KEYS = {
    "text": {"type"},
    "json_object": {"type"},
    "json_schema": {"type", "json_schema"},
}
_SCHEMA_KEYS = {"name", "description", "schema", "strict"}


def grammar_for(response_format: Mapping[str, Any] | None) -> str | None:
    """The llguidance grammar of an OpenAI `response_format` (None: unconstrained).

    Raises:
        ValueError: the format is malformed, of an unsupported type, or its schema is invalid or
            uses what the grammar library does not implement (the message names it).

    Example:
        >>> grammar_for({"type": "text"}) is None
        True
        >>> grammar_for({"type": "json_object"}) is not None
        True
        >>> grammar_for({"type": "json_schema", "json_schema": {"name": "x"}})
        Traceback (most recent call last):
        ...
        ValueError: response_format.json_schema.schema is required (a JSON Schema object)
    """
    if response_format is None:
        return None
    kind = response_format.get("type")
    if not isinstance(kind, str) or kind not in _FORMAT_KEYS:
        raise ValueError(
            f"response_format.type {kind!r} is not supported; use one of {sorted(_FORMAT_KEYS)}"
        )
    unknown = sorted(set(response_format) - _FORMAT_KEYS[kind])
    if unknown:
        raise ValueError(f"response_format of type {kind!r} has unknown fields {unknown}")
    if kind == "text":
        return None
    if kind == "json_object":
        return _compile(json.dumps({"type": "object"}))
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise ValueError(
            'response_format.json_schema is required: {"name": ..., "schema": {...}, '
            '"strict": true}'
        )
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    if unknown:
        raise ValueError(f"response_format.json_schema has unknown fields {unknown}")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            "response_format.json_schema.name must be 1-64 of [A-Za-z0-9_-], got " + repr(name)
        )
    if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
        raise ValueError("response_format.json_schema.strict must be a boolean")
    schema = spec.get("schema")
    if schema is None:
        raise ValueError("response_format.json_schema.schema is required (a JSON Schema object)")
    if not isinstance(schema, Mapping):
        raise ValueError("response_format.json_schema.schema must be a JSON Schema object")
    try:
        encoded = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"response_format.json_schema.schema is not JSON: {exc}") from exc
    return _compile(encoded)


@functools.lru_cache(maxsize=256)
def _compile(schema: str) -> str:
    """Grammar of a JSON-encoded schema, checked (cached: judges send one schema many times)."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    except (TypeError, ValueError, RuntimeError) as exc:  # a schema llguidance cannot read
        raise ValueError(f"response_format.json_schema.schema is not usable: {exc}") from exc
    if is_error:
        raise ValueError(f"response_format.json_schema.schema is not usable: {messages[0]}")
    return grammar


class GrammarMask:
    """Matchers and logit masks for one engine's tokenizer and vocabulary.

    Example:
        >>> masks = GrammarMask(tokenizer, vocab_size=49152, eos_ids=[2])  # doctest: +SKIP
        >>> matcher = masks.matcher(grammar_for({"type": "json_object"}))  # doctest: +SKIP
        >>> masks.apply(logits, [(0, matcher)])  # doctest: +SKIP
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_ids: Sequence[int]
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer,  # type: ignore[arg-type]  # a fast tokenizer (checked by llguidance)
            n_vocab=vocab_size,
            eos_token=self.eos_ids,
        )
        self._words = (vocab_size + 31) // 32

    def matcher(self, grammar: str) -> LLMatcher:
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher

    def allowed(self, matchers: Sequence[LLMatcher]) -> torch.Tensor:
        """Which tokens each matcher allows next: bool `[len(matchers), vocab_size]`."""
        return torch.from_numpy(self._allowed(matchers))

    def _allowed(self, matchers: Sequence[LLMatcher]) -> np.ndarray:
        # numpy, not torch: a few small ops that must not wait for a busy CPU's thread team
        bitmask = np.zeros((len(matchers), self._words), dtype=np.int32)  # [M, W], 32 tokens/word
        for k, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(bitmask[k].ctypes.data, bitmask[k].nbytes)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=-1, bitorder="little")  # [M, W * 32]
        allowed = bits[:, : self.vocab_size].view(np.bool_)  # [M, V]
        # A matcher in an error state allows nothing: end the sequence rather than sample NaN.
        for row in np.flatnonzero(~allowed.any(axis=-1)):
            allowed[row, self.eos_ids] = True
        return allowed

    def apply(self, logits: torch.Tensor, rows: Sequence[tuple[int, LLMatcher]]) -> torch.Tensor:
        """`logits` ([B, V], sampled from once: changed in place) with each listed row's
        forbidden tokens at -inf; returns it.

        Columns past `vocab_size` (a model's padded vocabulary) are forbidden too.
        """
        if not rows:
            return logits
        allowed = self._allowed([matcher for _, matcher in rows])  # [M, V]
        width = logits.shape[-1]
        bias = np.full((len(rows), width), -np.inf, dtype=np.float32)  # [M, width]
        columns = min(width, self.vocab_size)
        bias[:, :columns][allowed[:, :columns]] = 0.0
        index = [row for row, _ in rows]
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            logits.numpy()[index] += bias  # the same memory; numpy stays on this thread
        else:
            rows_t = torch.tensor(index, device=logits.device)
            logits.index_add_(0, rows_t, torch.from_numpy(bias).to(logits.device, logits.dtype))
        return logits
