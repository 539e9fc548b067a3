"""SFT and DPO samples from the small JSONL files shipped in tests/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.buffer.offline import OfflineDataError, load_dpo_samples, load_sft_samples
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.types import Sample

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    from agentscope_rft.models import load_tokenizer, resolve_model

    return ChatRenderer(load_tokenizer(resolve_model("tiny-random")))


def _trained_text(sample: Sample, renderer: ChatRenderer) -> list[str]:
    """The decoded runs of trained tokens."""
    runs: list[list[int]] = []
    previous = 0
    for token, flag in zip(sample.token_ids, sample.loss_mask, strict=True):
        if flag and not previous:
            runs.append([])
        if flag:
            runs[-1].append(token)
        previous = flag
    return [renderer.tokenizer.decode(run) for run in runs]


def _upto_last_turn(renderer: ChatRenderer, messages: list, tools: list | None = None) -> str:
    text = renderer.render_text(messages, tools, add_generation_prompt=False)
    return text[: text.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]


def test_sft_samples_train_assistant_turns_only(renderer: ChatRenderer) -> None:
    samples = load_sft_samples(DATA / "sft_tiny.jsonl", renderer)
    lines = [json.loads(line) for line in (DATA / "sft_tiny.jsonl").read_text().splitlines()]
    assert len(samples) == len(lines) == 4
    for sample, line in zip(samples, lines, strict=True):
        assert renderer.tokenizer.decode(sample.token_ids) == _upto_last_turn(
            renderer, line["messages"], line.get("tools")
        )  # exactly the template's text, up to the last reply's end of turn
        assert sample.kind == "sft" and set(sample.logprobs) == {0.0}
    assert _trained_text(samples[0], renderer) == ["Paris.<|im_end|>"]
    assert _trained_text(samples[1], renderer) == ["4<|im_end|>", "6<|im_end|>"]
    assert _trained_text(samples[2], renderer) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>",
        "It is sunny and 21 C in Paris.<|im_end|>",
    ]
    assert samples[2].num_calls == 2
    assert _trained_text(samples[3], renderer) == ["Hi!<|im_end|>"]
    assert samples[0].sample_id == "sft_tiny.jsonl:1"


def test_a_base_tokenizers_eos_does_not_move_the_trained_span() -> None:
    # Qwen2.5/3 base: eos <|endoftext|>, the ChatML template closes turns with <|im_end|>.
    from agentscope_rft.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model("tiny-random"))
    tokenizer.eos_token = "<|endoftext|>"
    base = ChatRenderer(tokenizer)
    samples = load_sft_samples(DATA / "sft_tiny.jsonl", base)
    assert _trained_text(samples[0], base) == ["Paris.<|im_end|>"]  # not its "\n" after
    assert _trained_text(samples[1], base) == ["4<|im_end|>", "6<|im_end|>"]


def test_dpo_samples_come_in_pairs(renderer: ChatRenderer) -> None:
    samples = load_dpo_samples(DATA / "dpo_tiny.jsonl", renderer)
    assert len(samples) == 6
    chosen, rejected = samples[0::2], samples[1::2]
    assert [s.kind for s in chosen] == ["dpo_chosen"] * 3
    assert [s.kind for s in rejected] == ["dpo_rejected"] * 3
    assert [s.pair_id for s in chosen] == [s.pair_id for s in rejected]
    assert len({s.pair_id for s in chosen}) == 3
    assert _trained_text(chosen[0], renderer) == ["42<|im_end|>"]
    assert _trained_text(rejected[1], renderer) == [
        "Purple, which is a mix of red and blue.<|im_end|>"
    ]
    # Earlier assistant turns of the prompt are context, not trained.
    assert _trained_text(chosen[2], renderer) == ["tac<|im_end|>"]
    prompt_len = chosen[2].loss_mask.index(1)
    assert chosen[2].token_ids[:prompt_len] == rejected[2].token_ids[:prompt_len]


@pytest.mark.parametrize(
    ("loader", "line", "message"),
    [
        ("sft", "{not json", ":2: not valid JSON"),
        ("sft", "[1, 2]", ":2: each line must be a JSON object"),
        ("sft", '{"msgs": []}', ":2: field 'messages' is missing (the line has 'msgs')"),
        ("sft", '{"messages": []}', ":2: field 'messages' must be a non-empty list"),
        (
            "sft",
            '{"prompt": [{"role": "user", "content": "x"}], "chosen": "a", "rejected": "b"}',
            ":2: field 'messages' is missing (this line is a DPO pair: set offline.format: dpo",
        ),
        (
            "sft",
            '{"sample_id": "s", "kind": "rl", "token_ids": [1, 2], "loss_mask": [0, 1]}',
            "exported by `agentscope-rft buffer export`: store the file back with "
            "`agentscope-rft buffer import",
        ),
        (
            "dpo",
            '{"messages": [{"role": "user", "content": "x"}]}',
            ":2: field 'prompt' is missing (this line is an SFT conversation: set offline.format",
        ),
        (
            "dpo",
            '{"chosen": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "a"}], '
            '"rejected": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "b"}]}',
            ":2: field 'prompt' is missing (write the conversation before the responses in",
        ),
        ("sft", '{"messages": [{"role": "user", "content": "x"}]}', ":2: field 'messages' has no"),
        (
            "sft",
            '{"messages": [{"role": "robot", "content": "x"}, '
            '{"role": "assistant", "content": "y"}]}',
            ":2: field 'messages': messages[0].role 'robot'",
        ),
        (
            "sft",
            '{"messages": [{"role": "assistant", "content": "y"}], "tools": {}}',
            ":2: field 'tools' must be a list",
        ),
        (
            "sft",
            '{"messages": [{"role": "assistant", "content": "y"}], "tools": ["get_weather"]}',
            ":2: field 'tools': tools[0] must be {'type': 'function'",
        ),
        (
            "sft",
            '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": ""}]}',
            ":2: field 'messages'[1] is an assistant turn with no text and no tool calls",
        ),
        (
            "sft",
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}',
            ":2: field 'messages'[1] is an assistant turn with no text",
        ),
        (
            "sft",
            '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "y", "weight": 0.5}]}',
            ":2: field 'messages'[1].weight must be 0 (context, not trained) or 1",
        ),
        (
            "sft",
            '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": "y", "weight": 0}]}',
            ":2: field 'messages' has no assistant turn to train on (every assistant turn is "
            'missing or has "weight": 0)',
        ),
        (
            "dpo",
            '{"prompt": [{"role": "user", "content": "x"}], "chosen": " ", "rejected": "b"}',
            ":2: field 'chosen' is empty",
        ),
        (
            "dpo",
            '{"prompt": [{"role": "user", "content": "x"}], "chosen": "b", '
            '"rejected": {"role": "assistant", "content": "b"}}',
            ":2: fields 'chosen' and 'rejected' are the same response",
        ),
        (
            "dpo",
            '{"prompt": [{"role": "user", "content": "x"}], "chosen": "a"}',
            "field 'rejected'",
        ),
        (
            "dpo",
            '{"prompt": [{"role": "assistant", "content": "x"}], "chosen": "a", "rejected": "b"}',
            ":2: field 'prompt' must not end with an assistant message",
        ),
        (
            "dpo",
            '{"prompt": [{"role": "user", "content": "x"}], "chosen": {"role": "user"}, '
            '"rejected": "b"}',
            ":2: field 'chosen' must be a string or one assistant message",
        ),
    ],
)
def test_bad_lines_name_file_line_and_field(
    renderer: ChatRenderer, tmp_path: Path, loader: str, line: str, message: str
) -> None:
    good = {
        "sft": '{"messages": [{"role": "user", "content": "q"}, '
        '{"role": "assistant", "content": "a"}]}',
        "dpo": '{"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}',
    }[loader]
    path = tmp_path / "data.jsonl"
    path.write_text(good + "\n" + line + "\n")
    load = load_sft_samples if loader == "sft" else load_dpo_samples
    with pytest.raises(OfflineDataError) as excinfo:
        load(path, renderer)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_empty_and_missing_files_fail(renderer: ChatRenderer, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(OfflineDataError, match="no samples"):
        load_sft_samples(empty, renderer)
    with pytest.raises(OfflineDataError, match="no such file"):
        load_dpo_samples(tmp_path / "missing.jsonl", renderer)


def test_files_from_other_tools_load_or_say_how_to_convert(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bom = tmp_path / "windows.jsonl"  # saved by a Windows editor: a byte-order mark first
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    assert len(load_sft_samples(bom, renderer)) == 1
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps([row, row]))
    with pytest.raises(OfflineDataError, match=r"array.jsonl:1: .*one JSON object per line"):
        load_sft_samples(array, renderer)
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text(json.dumps(row, indent=2))
    with pytest.raises(OfflineDataError, match=r"pretty.jsonl:1: not valid JSON.*per line"):
        load_sft_samples(pretty, renderer)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    parquet = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "completion": "a"}]), parquet)
    with pytest.raises(OfflineDataError, match=r"data.parquet: a Parquet file.*pq.read_table"):
        load_sft_samples(parquet, renderer)


def test_weight_0_turns_are_context_not_trained(renderer: ChatRenderer, tmp_path: Path) -> None:
    # OpenAI's fine-tuning files mark assistant turns not to learn from with "weight": 0.
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "5", "weight": 0},
        {"role": "user", "content": "Wrong, try again."},
        {"role": "assistant", "content": "4", "weight": 1},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    path = tmp_path / "weights.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    [sample] = load_sft_samples(path, renderer)
    assert _trained_text(sample, renderer) == ["4<|im_end|>", "6<|im_end|>"]
    assert sample.num_calls == 2
    # The untrained turn is still in the context, rendered as the template renders it.
    assert renderer.tokenizer.decode(sample.token_ids) == _upto_last_turn(renderer, messages)
    # An empty assistant turn is fine as untrained context.
    messages[1] = {"role": "assistant", "content": "", "weight": 0}
    path.write_text(json.dumps({"messages": messages}) + "\n")
    [sample] = load_sft_samples(path, renderer)
    assert _trained_text(sample, renderer) == ["4<|im_end|>", "6<|im_end|>"]


def test_trl_prompt_completion_and_preference_rows(renderer: ChatRenderer, tmp_path: Path) -> None:
    """TRL's dataset formats, standard (texts) and conversational (message lists), train the same
    tokens as the equivalent `messages` / message-object rows."""
    user, answer = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}
    sft = tmp_path / "sft.jsonl"
    rows = [
        {"messages": [user, answer]},
        {"prompt": "2+2?", "completion": "4"},
        {"prompt": [user], "completion": [answer]},
    ]
    sft.write_text("".join(json.dumps(row) + "\n" for row in rows))
    samples = load_sft_samples(sft, renderer)
    assert [s.token_ids for s in samples[1:]] == [samples[0].token_ids] * 2
    assert [s.loss_mask for s in samples[1:]] == [samples[0].loss_mask] * 2
    assert _trained_text(samples[1], renderer) == ["4<|im_end|>"]
    # An assistant turn in the prompt is context: only the completion trains.
    sft.write_text(json.dumps({"prompt": [user, answer, user], "completion": "5"}) + "\n")
    [sample] = load_sft_samples(sft, renderer)
    assert _trained_text(sample, renderer) == ["5<|im_end|>"]

    dpo = tmp_path / "dpo.jsonl"
    rows = [
        {"prompt": [user], "chosen": "4", "rejected": "5"},
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": [user], "chosen": [answer], "rejected": [{"role": "assistant", "content": "5"}]},
    ]
    dpo.write_text("".join(json.dumps(row) + "\n" for row in rows))
    samples = load_dpo_samples(dpo, renderer)
    assert [s.token_ids for s in samples[2:4]] == [s.token_ids for s in samples[0:2]]
    assert [s.token_ids for s in samples[4:6]] == [s.token_ids for s in samples[0:2]]
    assert [s.loss_mask for s in samples[4:6]] == [s.loss_mask for s in samples[0:2]]


def test_a_dpo_responses_thinking_trains_and_thinking_given_twice_is_named(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    """`reasoning_content` (or `reasoning`) is the turn's `<think>` block, as the model wrote it
    (it was dropped: a template that reads no thinking trained the answer alone)."""
    pairs = tmp_path / "pairs.jsonl"
    pair = {
        "prompt": "2+2?",
        "chosen": {"role": "assistant", "content": "4", "reasoning_content": "\nTwo and two.\n"},
        "rejected": {"role": "assistant", "content": "5", "reasoning": "Guess."},
    }
    pairs.write_text(json.dumps(pair) + "\n")
    chosen, rejected = load_dpo_samples(pairs, renderer)
    assert _trained_text(chosen, renderer) == ["<think>\nTwo and two.\n</think>\n\n4<|im_end|>"]
    assert _trained_text(rejected, renderer) == ["<think>\nGuess.\n</think>\n\n5<|im_end|>"]
    both = {"role": "assistant", "content": "<think>\nx\n</think>\n\n4", "reasoning": "x"}
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "2+2?"}, both]}) + "\n")
    with pytest.raises(
        OfflineDataError,
        match=r"sft.jsonl:1: field 'messages': messages\[1\] "
        "has both reasoning and a <think> block in its content",
    ):
        load_sft_samples(data, renderer)
