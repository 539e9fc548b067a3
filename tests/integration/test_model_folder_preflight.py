"""A user's model folder that cannot be trained is refused by preflight, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, T5Config

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.models import ModelNotFoundError
from agentscope_rft.runtime.preflight import preflight

APP = str(Path(__file__).with_name("toy_app.py")) + ":run"


def _sets(model: Path, toy_tasks: str, tmp_path: Path) -> list[str]:
    return [
        f"model.name_or_path={model}",
        f"workflow={APP}",
        f"tasks.train={toy_tasks}",
        "engine.device=cpu",
        f"run.dir={tmp_path / 'run'}",
    ]


def test_a_model_transformers_cannot_load_as_a_causal_lm_is_refused(
    tiny_model_path, toy_tasks, tmp_path
):
    """T5 failed with a ValueError traceback when the trainer loaded it."""
    folder = tmp_path / "t5"
    T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(folder)
    with pytest.raises(ModelNotFoundError) as error:
        preflight(load_config(None, _sets(folder, toy_tasks, tmp_path)))
    assert str(error.value) == (
        f"{folder} holds a 't5' model (architectures: none), which transformers does not load as "
        "a causal LM (AutoModelForCausalLM); agentscope-rft trains decoder-only causal language "
        "models: pass one (Llama, Qwen, Mistral, GPT-2, ...)"
    )


def test_a_tokenizer_larger_than_the_models_embedding_is_refused(
    tiny_model_path, toy_tasks, tmp_path
):
    """Every request failed with an IndexError in the engine while the run went on at reward 0."""
    folder = tmp_path / "small-vocab"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(ModelNotFoundError) as error:
        preflight(load_config(None, _sets(folder, toy_tasks, tmp_path)))
    message = str(error.value)
    assert message.startswith(
        f"the tokenizer in {folder} has {len(tokenizer)} tokens but the model's embedding has "
        "1000 (vocab_size in config.json)"
    )
    assert "model.resize_token_embeddings(len(tokenizer))" in message
    # an embedding larger than the tokenizer (a vocabulary padded to a multiple) is fine
    padded = tmp_path / "padded-vocab"
    config.vocab_size = len(tokenizer) + 64
    LlamaForCausalLM(config).save_pretrained(padded)
    tokenizer.save_pretrained(padded)
    preflight(load_config(None, _sets(padded, toy_tasks, tmp_path)))


def test_lora_target_modules_the_model_does_not_have_are_refused(
    tiny_model_path, toy_tasks, tmp_path
):
    """A list matching no layer was peft's traceback at the trainer's start; a misspelt name
    beside a matching one was ignored (that layer silently not trained)."""
    sets = [*_sets(Path(tiny_model_path), toy_tasks, tmp_path), "trainer.lora.rank=4"]
    with pytest.raises(ConfigError) as error:
        preflight(load_config(None, [*sets, "trainer.lora.target_modules=[q_proj,v_prj]"]))
    assert str(error.value) == (
        f"trainer.lora.target_modules names v_prj, which the model in {tiny_model_path} does "
        "not have; its linear layers are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, "
        "v_proj (or set `all-linear`)"
    )
    preflight(load_config(None, [*sets, "trainer.lora.target_modules=[q_proj,self_attn.v_proj]"]))


@pytest.mark.parametrize("needs_code", ["model", "tokenizer"])
def test_a_model_folder_whose_code_would_have_to_run_is_refused_naming_it(
    needs_code, tiny_model_path, toy_tasks, tmp_path
):
    """A remote-code model (auto_map) failed with transformers' own message ('pass the argument
    trust_remote_code=True', an argument no config key reaches; for a tokenizer, after asking
    on the terminal whether to run the code). Its code is not run; a model_type transformers
    knows loads with its own class despite an auto_map."""
    import json
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(tiny_model_path, folder)
    file = folder / ("config.json" if needs_code == "model" else "tokenizer_config.json")
    settings = json.loads(file.read_text())
    if needs_code == "model":
        settings["auto_map"] = {"AutoConfig": "configuration_my.MyConfig"}
        preflight(load_config(None, _sets(folder, toy_tasks, tmp_path)))  # llama: transformers'
        settings["model_type"] = "my_llama"
        names = (
            "config.json auto_map: AutoConfig -> configuration_my.MyConfig; model_type 'my_llama'"
        )
    else:
        settings["auto_map"] = {"AutoTokenizer": ["tokenization_my.MyTokenizer", None]}
        settings["tokenizer_class"] = "MyTokenizer"
        names = (
            "tokenizer_config.json auto_map: AutoTokenizer -> tokenization_my.MyTokenizer; "
            "tokenizer_class 'MyTokenizer'"
        )
    file.write_text(json.dumps(settings))
    with pytest.raises(ModelNotFoundError) as error:
        preflight(load_config(None, _sets(folder, toy_tasks, tmp_path)))
    message = str(error.value)
    assert message.startswith(f"{folder} needs Python code it ships to load ({names} is not in ")
    assert "agentscope-rft never runs code from a model folder" in message
    assert "convert the folder to it" in message
