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


def bf16_model(tiny_model_path: str, folder: Path) -> Path:
    """The tiny model as a bf16 model folder (config.json `dtype: bfloat16`, bf16 safetensors)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(tiny_model_path) / name).is_file():
            shutil.copy(Path(tiny_model_path) / name, folder / name)
    return folder


def test_a_bf16_model_is_checkpointed_in_bf16_and_resumes_from_its_fp32_weights(
    tiny_model_path, tmp_path
):
    """A bf16 model's checkpoints (and so `export`) were written in the trainer's fp32: twice the
    files a user deploys, and a config.json saying float32."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.trainers.config import TorchTrainerConfig
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    source = bf16_model(tiny_model_path, tmp_path / "bf16")
    config = TorchTrainerConfig(dtype="float32")
    trainer = TorchTrainer(source, config, AlgorithmConfig(), total_steps=1)
    with torch.no_grad():  # trained weights: fp32 values bf16 cannot hold
        for param in trainer.model.parameters():
            param.add_(torch.randn_like(param) * 1e-3)
    checkpoint = tmp_path / "step-000001"
    trainer.save(checkpoint)
    trainer.export_hf(checkpoint / "model")

    assert json.loads((checkpoint / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    saved = load_file(str(checkpoint / "model" / "model.safetensors"))
    trained = dict(trainer.model.named_parameters())
    for name, tensor in saved.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, trained[name].detach().to(torch.bfloat16)), name
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint / "model", dtype="auto")
    assert loaded.dtype == torch.bfloat16

    resumed = TorchTrainer(source, config, AlgorithmConfig(), total_steps=1)
    resumed.load(checkpoint)
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(param, trained[name], rtol=0, atol=0)
