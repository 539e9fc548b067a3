"""A checkpoint's `model/` folder is the trained policy as transformers loads it."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from agentscope_rft.runtime.local import train

from .test_stop_resume import sft_config


async def test_a_checkpoint_carries_the_chat_template_the_policy_was_trained_with(
    tiny_model_path, tmp_path
):
    """With `model.chat_template` set, checkpoints (and so `export`) held the model folder's
    template: the exported model was served with a template it was not trained with."""
    folder_template = AutoTokenizer.from_pretrained(tiny_model_path).chat_template
    custom = folder_template + "{# the template trained with #}"
    template_file = tmp_path / "custom.jinja"
    template_file.write_text(custom)
    run_dir = tmp_path / "run"
    await train(
        sft_config(tiny_model_path, run_dir, f"model.chat_template={template_file}"), run_dir
    )
    model = Path(run_dir) / "checkpoints" / "step-000001" / "model"
    assert AutoTokenizer.from_pretrained(model).chat_template == custom
