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
