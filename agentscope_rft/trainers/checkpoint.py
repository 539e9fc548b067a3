"""Trainer weights and checkpoints: HF folders for engines, optimizer state for resuming.

A checkpoint folder holds `model/` (an HF model folder with the full, LoRA-merged weights and the
tokenizer, in the dtype of the model the run started from: servable with `agentscope-rft serve
--model <ckpt>/model`), `adapter/` when training LoRA, and `trainer.pt` (optimizer, LR schedule,
value head, RNG) for exact resumption, beside `weights.safetensors` (the trainer's fp32 weights)
when `model/` holds them in a narrower dtype (a bf16 model's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from agentscope_rft.trainers.optim import set_base_lrs

if TYPE_CHECKING:
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
MASTER_WEIGHTS = "weights.safetensors"
"""The trainer's own (fp32) weights of a checkpoint whose `model/` holds them in bf16 or fp16."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _is_peft(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """HF-named full weights (LoRA adapters merged in).

    Without LoRA these are the live parameters (no copy): use them before the next optimizer
    step, as the training loop's weight sync does. With LoRA they are merged copies.

    Example:
        >>> weights = merged_state_dict(trainer.model)  # doctest: +SKIP
    """
    if not _is_peft(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()  # type: ignore[operator]
    try:
        base = model.get_base_model()  # type: ignore[operator]
        out = {}
        for name, value in base.state_dict().items():
            if "lora_" in name:
                continue
            out[name.replace(".base_layer.", ".")] = value.detach().clone()
        return out
    finally:
        model.unmerge_adapter()  # type: ignore[operator]


def copy_tokenizer(source: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def model_dtype(folder: Path) -> torch.dtype:
    """The dtype an HF model folder's config.json gives its weights (`dtype`, or `torch_dtype`
    as transformers 4 wrote it); float32 when it names none.

    Example:
        >>> model_dtype(Path("models/qwen2.5-0.5b-instruct"))  # doctest: +SKIP
        torch.bfloat16
    """
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return torch.float32
    for settings in (config, config.get("text_config") or {}):
        name = settings.get("dtype") or settings.get("torch_dtype")
        if isinstance(name, str) and name in DTYPES:
            return DTYPES[name]
    return torch.float32


def in_dtype(state: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """`state` with its floating-point tensors in `dtype` (integer buffers as they are); a cast
    copy is made in host memory, not beside the trainer's weights on its GPU."""
    return {
        k: v.to("cpu", dtype) if v.is_floating_point() and v.dtype != dtype else v
        for k, v in state.items()
    }


def write_config_dtype(folder: Path, dtype: torch.dtype) -> None:
    """Make the config.json of the HF model folder `folder` name `dtype` as its weights' dtype
    (transformers writes the dtype of the module it saved: the trainer's fp32)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_hf_model(trainer: TorchTrainer, target: Path, source_model: Path) -> None:
    """The current policy as an HF model folder (weights + config + tokenizer), its weights in
    the dtype of `source_model` (a bf16 model's export is bf16, not the trainer's fp32)."""
    target.mkdir(parents=True, exist_ok=True)
    base = trainer._base()
    dtype = model_dtype(source_model)
    state = without_tied_copies(merged_state_dict(trainer.model), base)
    base.save_pretrained(target, state_dict=in_dtype(state, dtype), safe_serialization=True)
    write_config_dtype(target, dtype)
    copy_tokenizer(source_model, target)


def write_chat_template(folder: Path, template: str) -> None:
    """Make `template` (`model.chat_template`, what the policy was trained with) the chat template
    of the HF model folder `folder`, in place of the one its tokenizer came with.

    Example:
        >>> write_chat_template(run_dir / "checkpoints/step-000004/model", text)  # doctest: +SKIP
    """
    (folder / "chat_template.jinja").write_text(template)
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():  # a template there too would be a second, conflicting one
        settings = json.loads(tokenizer_config.read_text())
        if settings.pop("chat_template", None) is not None:
            tokenizer_config.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")


def without_tied_copies(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """`state` less the tied weights (lm_head = embeddings) held as a second, equal tensor.

    `save_pretrained` of the live model writes a tied weight once; a gathered or LoRA-merged state
    dict holds it as two tensors, which it would write twice (the embedding's size again on disk).
    """
    tied = getattr(model, "_tied_weights_keys", None) or {}
    config: Any = getattr(model, "config", None)
    if (
        not isinstance(tied, dict)
        or config is None
        or not config.get_text_config().tie_word_embeddings
    ):
        return state
    state = dict(state)
    for name, source in tied.items():
        if name in state and source in state and torch.equal(state[name], state[source]):
            del state[name]
    return state


def save_hf_weights(state: dict[str, Tensor], source_model: Path, target: Path) -> None:
    """An HF model folder from a full HF-named state dict and the source model's config and
    tokenizer (for trainers whose model is not an HF module in this process, e.g. verl's).

    Example:
        >>> state = trainer.state_dict_for_sync()  # doctest: +SKIP
        >>> save_hf_weights(state, model_path, run_dir / "model")  # doctest: +SKIP
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(source_model)
    with init_empty_weights():
        shell = AutoModelForCausalLM.from_config(config)
    dtype = model_dtype(source_model)
    state = in_dtype(without_tied_copies(state, shell), dtype)
    shell.save_pretrained(target, state_dict=state, safe_serialization=True)
    write_config_dtype(target, dtype)
    copy_tokenizer(source_model, target)


def save_trainer_state(trainer: TorchTrainer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if _is_peft(trainer.model):
        trainer.model.save_pretrained(directory / "adapter")
    elif model_dtype(trainer.model_path) != torch.float32:
        # model/ holds the weights in the model's own dtype: resume from the trainer's own
        from safetensors.torch import save_file

        weights = without_tied_copies(merged_state_dict(trainer.model), trainer.model)
        save_file({k: v.contiguous() for k, v in weights.items()}, directory / MASTER_WEIGHTS)
    state: dict[str, Any] = {
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "optimizer_steps": trainer.optimizer_steps,
        "value_head": trainer.value_head.state_dict() if trainer.value_head else None,
        "torch_rng": torch.get_rng_state(),
    }
    torch.save(state, directory / "trainer.pt")


def load_trainer_state(trainer: TorchTrainer, directory: Path) -> None:
    """Restore weights from `directory/model` (or `adapter`) and the optimizer state."""
    from safetensors.torch import load_file

    if _is_peft(trainer.model):
        from peft import set_peft_model_state_dict

        adapter = directory / "adapter"
        files = sorted(adapter.glob("*.safetensors"))
        state_dict: dict[str, Tensor] = {}
        for file in files:
            state_dict.update(load_file(str(file)))
        set_peft_model_state_dict(trainer.model, state_dict)
    else:
        weights: dict[str, Tensor] = {}
        master = directory / MASTER_WEIGHTS
        model = sorted((directory / "model").glob("*.safetensors"))
        files = [master] if master.is_file() else model
        for file in files:
            weights.update(load_file(str(file)))
        missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"}
        if set(missing) - tied or unexpected:
            raise ValueError(
                f"checkpoint {directory} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
    state = torch.load(directory / "trainer.pt", map_location="cpu", weights_only=False)
    configured = _configured_settings(trainer)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict({**state["scheduler"], **configured["scheduler"]})
    _apply_configured(trainer, configured["groups"])
    trainer.optimizer_steps = int(state["optimizer_steps"])
    if trainer.value_head is not None and state["value_head"] is not None:
        trainer.value_head.load_state_dict(state["value_head"])
    torch.set_rng_state(state["torch_rng"])


def _configured_settings(trainer: TorchTrainer) -> dict[str, Any]:
    """The optimizer's hyper-parameters and the LR schedule as this run's config sets them."""
    scheduler = trainer.scheduler.state_dict()
    return {
        "groups": [
            {k: v for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups
        ],
        "scheduler": {"base_lrs": scheduler["base_lrs"], "lr_lambdas": scheduler["lr_lambdas"]},
    }


def _apply_configured(trainer: TorchTrainer, groups: list[dict[str, Any]]) -> None:
    """A checkpoint brings AdamW's moments and the schedule's position; the config (which a
    resume with `--set` or a fork may change) keeps the learning rate, its schedule, betas and
    weight decay. With the config unchanged, every value is the checkpoint's own."""
    for group, settings in zip(trainer.optimizer.param_groups, groups, strict=True):
        group.update({k: v for k, v in settings.items() if k not in ("lr", "initial_lr")})
    set_base_lrs(trainer.optimizer, trainer.scheduler, trainer.scheduler.base_lrs)
