"""Streamed content: `IncrementalDecoder` and `TextStream` give, delta by delta, exactly the text
a whole decode gives, with the embedded model's real tokenizer."""

from __future__ import annotations

import random

import pytest

from agentscope_rft.chat.template import decode_text
from agentscope_rft.engines.chat import IncrementalDecoder, TextStream
from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model

TEXTS = [
    "The capital of France is Paris; its population was 2,102,650 in 2023.",
    "北京是中国的首都。東京は日本の首都です。서울은 한국의 수도입니다.",
    "Emoji 🙂👍🏽 and accents: naïve café, Ωμέγα, Привет мир!",
    '<tool_call>\n{"name": "search", "arguments": {"query": "AT&T"}}\n</tool_call>',
    "  leading spaces,\ttabs,\n\nnewlines and trailing spaces  ",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(TINY_MODEL))


def streamed(tokenizer, ids: list[int], stops: list[str], final_text: str) -> str:
    stream = TextStream(tokenizer, stops, parse_tools=False)
    deltas = [stream.push(i) for i in ids]
    for stop in stops:
        assert all(stop not in d for d in deltas)
    return "".join(deltas) + stream.finish(final_text)


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_whole_decode(tokenizer, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(tokenizer)
    assert "".join(decoder.push(i) for i in ids) == decode_text(tokenizer, ids) == text
    assert streamed(tokenizer, ids, [], text) == text


def test_random_token_ids_including_special_and_partial_bytes(tokenizer) -> None:
    rng = random.Random(0)
    vocab = len(tokenizer)
    special = list(tokenizer.all_special_ids)
    for _ in range(200):
        ids = [
            rng.choice(special) if rng.random() < 0.05 else rng.randrange(vocab)
            for _ in range(rng.randrange(1, 60))
        ]
        whole = decode_text(tokenizer, ids)
        decoder = IncrementalDecoder(tokenizer)
        emitted = "".join(decoder.push(i) for i in ids)
        assert whole.startswith(emitted)  # never emits what a whole decode would not
        assert len(whole) - len(emitted) <= 8  # holds back at most an incomplete character
        assert streamed(tokenizer, ids, [], whole) == whole


@pytest.mark.parametrize("stops", [["Paris"], [";", "capital"], ["2023."], ["tool_call>"]])
def test_stop_strings_cut_the_stream_where_the_engine_cuts_the_text(tokenizer, stops) -> None:
    text = TEXTS[0] + " " + TEXTS[3]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cut = min((text.find(s) for s in stops if s in text), default=len(text))
    assert streamed(tokenizer, ids, stops, text[:cut]) == text[:cut]


def test_streaming_decodes_each_token_a_bounded_number_of_times(tokenizer) -> None:
    # Decoding the whole completion at every token is quadratic: seconds of the event loop for
    # one long streamed reply. Counted, not timed.
    ids = tokenizer(" ".join(TEXTS) * 40, add_special_tokens=False)["input_ids"][:3000]
    decoded = 0
    decode = tokenizer.decode

    def counting(token_ids, *args, **kwargs):
        nonlocal decoded
        decoded += len(token_ids)
        return decode(token_ids, *args, **kwargs)

    tokenizer.decode = counting
    try:
        stream = TextStream(tokenizer, ["</never>"], parse_tools=True)
        out = "".join(stream.push(i) for i in ids)
    finally:
        del tokenizer.decode
    assert out == decode_text(tokenizer, ids)[: len(out)] and len(out) > 0
    assert decoded < 20 * len(ids)  # the whole-text decode: ~len(ids)**2 / 2 = 4.5M
