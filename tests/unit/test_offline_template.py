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
