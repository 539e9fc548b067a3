"""Offline SFT data is rendered with the run's `model.chat_template`, the engine's layout."""

import json
from pathlib import Path

from agentscope_rft.config import load_config
from agentscope_rft.runtime.offline import offline_batches

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} [[custom]]\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant [[custom]]\n"
    "{% endif %}"
)


def test_demonstrations_render_with_the_configured_template(
    tiny_model_path: str, tmp_path: Path, caplog
):
    from agentscope_rft.models import load_tokenizer

    demos = tmp_path / "demos.jsonl"
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    demos.write_text(json.dumps({"messages": chat}) + "\n")
    (tmp_path / "t.jsonl").write_text('{"id": 0, "prompt": "x"}\n')

    def first_text(*extra: str) -> str:
        config = load_config(
            None,
            [
                f"model.name_or_path={tiny_model_path}",
                "workflow=app.py:run",
                f"tasks.train={tmp_path / 't.jsonl'}",
                f"offline.path={demos}",
                "offline.warmup_steps=1",
                *extra,
            ],
        )
        [sample] = next(offline_batches(config))
        return load_tokenizer(tiny_model_path).decode(sample.token_ids)

    with caplog.at_level("INFO", logger="agentscope_rft.runtime.offline"):
        assert "[[custom]]" not in first_text()
    # batch_size 8 of a one-sample file: the batch is smaller than configured, and says so
    assert f"offline.batch_size 8 is more than the 1 samples of {demos}" in caplog.text
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    assert first_text(f"model.chat_template={template}").count("[[custom]]") == 2


def test_a_conversation_longer_than_the_context_window_fails_at_load_naming_its_line(
    tiny_model_path: str, tmp_path: Path
):
    import pytest

    from agentscope_rft.buffer.offline import OfflineDataError

    demos = tmp_path / "demos.jsonl"
    short = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    long = [{"role": "user", "content": "word " * 9000}, {"role": "assistant", "content": "ok"}]
    demos.write_text(json.dumps({"messages": short}) + "\n" + json.dumps({"messages": long}) + "\n")

    def load(*extra: str) -> None:
        config = load_config(
            None,
            [
                f"model.name_or_path={tiny_model_path}",
                "run.mode=offline",
                "algorithm.objective=sft",
                f"offline.path={demos}",
                *extra,
            ],
        )
        next(offline_batches(config))

    # The tiny model has 8192 positions: the second line cannot be trained.
    with pytest.raises(OfflineDataError) as excinfo:
        load()
    message = str(excinfo.value)
    assert message.startswith(f"{demos}:2: field 'messages' renders to ")
    assert "more than the 8192 the run can train (the model's context window" in message
    with pytest.raises(
        OfflineDataError,
        match=r":2: .* more than the 64 the run can train "
        r"\(model.max_model_len\)",
    ):
        load("model.max_model_len=64")
    demos.write_text(json.dumps({"messages": short}) + "\n")
    with pytest.raises(OfflineDataError, match=r":1: .*\(trainer.max_seq_len\)"):
        load("trainer.max_seq_len=16")
    load("trainer.max_seq_len=64")  # fits
    # DPO pairs: each side is checked.
    pairs = tmp_path / "pairs.jsonl"
    pair = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": "4", "rejected": "x " * 40}
    pairs.write_text(json.dumps(pair) + "\n")
    with pytest.raises(OfflineDataError, match=r":1: field 'rejected' renders to"):
        load(
            f"offline.path={pairs}",
            "offline.format=dpo",
            "algorithm.objective=dpo",
            "trainer.max_seq_len=48",
        )


def test_offline_tokens_are_the_engines_for_the_same_episode(tmp_path: Path):
    """The file's conversation was tokenized in one pass, the engine's episode turn by turn: a
    reply opening with whitespace ('  two', '\\n\\n- a') merged with the generation prompt's
    newline into other tokens, and the trained mask lost them. The engine's ids here are its
    PromptBuilder's (the prompts it renders, reusing each reply's sampled tokens) with each
    reply sampled as its text's own tokens."""
    from agentscope_rft.buffer.offline import load_sft_samples
    from agentscope_rft.chat.template import ChatRenderer
    from agentscope_rft.engines.base import ChatRequest, ChoiceResult
    from agentscope_rft.engines.chat import PromptBuilder
    from agentscope_rft.models import TINY_MODEL, load_tokenizer, resolve_model
    from agentscope_rft.types import SamplingParams

    renderer = ChatRenderer(load_tokenizer(resolve_model(TINY_MODEL)))  # SmolLM2's tokenizer
    chat = [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": "one?"},
        {"role": "assistant", "content": "  two"},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "\n\n- a\n- b"},
        {"role": "user", "content": "sum 2+3"},
        {"role": "assistant", "content": " 5"},
    ]
    builder = PromptBuilder(renderer)
    engine_ids: list[int] = []
    generated: list[int] = []
    for index, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        request = ChatRequest(chat[:index], SamplingParams(), rollout_id="r")
        prompt_ids, _ = builder.build(request)
        reply_ids = renderer.encode(message["content"] + renderer.end_of_turn)
        choice = ChoiceResult(
            0, reply_ids, [0.0] * len(reply_ids), "stop", 0, "", message["content"]
        )
        builder.remember(request, prompt_ids, [choice])
        assert prompt_ids[: len(engine_ids)] == engine_ids  # one sample: each prompt extends
        generated += [0] * (len(prompt_ids) - len(engine_ids)) + [1] * len(reply_ids)
        engine_ids = prompt_ids + reply_ids

    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": chat}) + "\n")
    [sample] = load_sft_samples(data, renderer)
    assert sample.token_ids == engine_ids
    assert sample.loss_mask == generated
