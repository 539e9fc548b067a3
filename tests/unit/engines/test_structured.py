"""The structured-output mask: `response_format` checks and the per-row token masks, with the
embedded model's real tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from agentscope_rft.engines.sampling import sample_next
from agentscope_rft.engines.structured import GrammarMask, grammar_for
from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model
from agentscope_rft.types import SamplingParams

EOS = 2
VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def json_schema(schema: object, **extra: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, **extra}}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(TINY_MODEL))


@pytest.fixture(scope="module")
def masks(tokenizer) -> GrammarMask:
    return GrammarMask(tokenizer, VOCAB, [EOS])


def test_text_and_none_are_unconstrained() -> None:
    assert grammar_for(None) is None
    assert grammar_for({"type": "text"}) is None
    assert grammar_for(json_schema(SCHEMA, strict=True)) == grammar_for(json_schema(SCHEMA))


@pytest.mark.parametrize(
    ("response_format", "named"),
    [
        ({"type": "regex"}, "'regex' is not supported"),
        ({"type": "json_object", "schema": {}}, "unknown fields ['schema']"),
        (json_schema(SCHEMA, extra=1), "unknown fields ['extra']"),
        ({"type": "json_schema", "json_schema": {"name": "has space", "schema": SCHEMA}}, "name"),
        (json_schema(SCHEMA, strict="yes"), "strict must be a boolean"),
        (json_schema([1]), "must be a JSON Schema object"),
        (json_schema({"type": "strin"}), "strin"),
        (json_schema({"type": "string", "format": "colour"}), "colour"),
        (json_schema({"type": "object", "if": {"required": ["a"]}}), "if"),
    ],
)  # fmt: skip
def test_bad_formats_name_the_problem(response_format: dict, named: str) -> None:
    with pytest.raises(ValueError, match="response_format") as caught:
        grammar_for(response_format)
    assert named in str(caught.value)


def allowed_texts(masks: GrammarMask, tokenizer, matcher) -> set[str]:
    ids = masks.allowed([matcher])[0].nonzero().flatten().tolist()
    return {tokenizer.decode([i]) for i in ids}


def test_mask_follows_the_grammar_and_allows_eos_only_when_complete(masks, tokenizer) -> None:
    matcher = masks.matcher(grammar_for(json_schema(SCHEMA)))  # type: ignore[arg-type]
    first = masks.allowed([matcher])[0]
    assert not first[EOS]
    assert all(text.startswith("{") for text in allowed_texts(masks, tokenizer, matcher))
    for token in tokenizer.encode('{"ok":true', add_special_tokens=False):
        assert matcher.consume_token(token)
    assert not masks.allowed([matcher])[0][EOS]  # the object is not closed yet
    assert matcher.consume_token(tokenizer.encode("}", add_special_tokens=False)[0])
    done = masks.allowed([matcher])[0]
    assert done.nonzero().flatten().tolist() == [EOS]  # complete: only the end remains


def test_apply_masks_only_the_constrained_rows_and_padded_columns(masks) -> None:
    grammar = grammar_for({"type": "json_object"})
    assert grammar is not None
    logits = torch.randn(3, VOCAB + 64)  # a model's vocabulary padded past the tokenizer's
    masked = masks.apply(logits.clone(), [(1, masks.matcher(grammar))])
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    allowed = masks.allowed([masks.matcher(grammar)])[0]
    assert torch.isinf(masked[1, :VOCAB][~allowed]).all()
    assert torch.equal(masked[1, :VOCAB][allowed], logits[1, :VOCAB][allowed])
    assert torch.isinf(masked[1, VOCAB:]).all()
    assert masks.apply(logits, []) is logits


def test_sampling_from_masked_logits(masks, tokenizer) -> None:
    grammar = grammar_for(json_schema(SCHEMA))
    assert grammar is not None
    matcher = masks.matcher(grammar)
    logits = torch.zeros(2, VOCAB)
    logits[:, tokenizer.encode("Sure", add_special_tokens=False)[0]] = 50.0  # forbidden, likely
    masked = masks.apply(logits, [(0, matcher), (1, masks.matcher(grammar))])
    out = sample_next(
        masked,
        [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)],
        [None, torch.Generator().manual_seed(0)],
    )
    allowed = masks.allowed([matcher])[0]
    assert all(bool(allowed[token]) for token in out.token_ids)
    # log-probs are those of the masked distribution: uniform over the allowed tokens here
    expected = -torch.log(allowed.sum().float()).item()
    assert out.logprobs == pytest.approx([expected, expected], abs=1e-5)


def test_a_whole_completion_under_random_logits_parses(masks, tokenizer) -> None:
    schema = {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            "label": {"enum": ["a", "b"]},
        },
        "required": ["score", "label"],
        "additionalProperties": False,
    }
    grammar = grammar_for(json_schema(schema))
    assert grammar is not None
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        matcher = masks.matcher(grammar)
        tokens: list[int] = []
        while not tokens or tokens[-1] != EOS:
            assert len(tokens) < 40
            logits = masks.apply(torch.randn(1, VOCAB, generator=generator) * 4, [(0, matcher)])
            token = sample_next(logits, [SamplingParams()], [generator]).token_ids[0]
            assert matcher.consume_token(token)
            tokens.append(token)
        answer = json.loads(tokenizer.decode(tokens[:-1]))
        assert 0 <= answer["score"] <= 1 and answer["label"] in {"a", "b"}


def test_a_matcher_in_error_allows_only_the_end(masks) -> None:
    grammar = grammar_for({"type": "json_object"})
    assert grammar is not None
    matcher = masks.matcher(grammar)
    assert not matcher.consume_token(EOS)  # EOS before any JSON: the matcher is in error
    assert masks.allowed([matcher])[0].nonzero().flatten().tolist() == [EOS]
