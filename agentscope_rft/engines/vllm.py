"""The vLLM engine: vLLM's own OpenAI server as supervised replicas, behind the engine contract.

vLLM runs as a separate process per replica (`vllm_server.VLLMServer`), from its own virtual
environment, so its torch/transformers pins never meet the trainer's. The engine talks HTTP:

- **Chat.** By default (`chat_rendering="engine"`) the engine renders prompts with the project's
  chat layer, exactly as the embedded engine does (reusing the token ids an episode's earlier calls
  sampled), sends the token ids to `/v1/completions` and parses Hermes tool calls itself: a call
  recorded through vLLM is token for token what the embedded engine would record. With
  `chat_rendering="vllm"` messages go to `/v1/chat/completions`; vLLM renders them with the model's
  template and parses tool calls with its `--tool-call-parser` (any model family vLLM supports);
  prompt ids come back with the response. Either way vLLM is called non-streamed with
  `return_token_ids` and log-probs, and streamed clients get the final content as one delta: no
  streamed tool-call token ids to lose. (`vllm_chat.py`)
- **Replicas.** Each rollout sticks to one replica (a stable hash of its id) so its prefix cache
  is reused; calls without a rollout go to the least busy replica. (`vllm_replicas.py`)
- **Weight sync.** `load_weights` closes the gate for new calls, drains in-flight calls
  (`sync_mode="wait"`) or freezes them (`"keep"`), reloads weights from a checkpoint folder on
  every replica (`/collective_rpc reload_weights`), resets the prefix cache, resumes and bumps the
  version. `load_lora` loads a LoRA adapter named by version instead. (`vllm_weights.py`) NCCL
  transfer from a trainer on other GPUs is in `vllm_nccl.py`.

This module starts (or connects to) the replicas and wires those three together.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from agentscope_rft.chat.reasoning import ReasoningParser, resolve_reasoning_parser
from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.engines.base import ChatEvent, ChatRequest, EngineError, GenerationOutput
from agentscope_rft.engines.chat import PromptBuilder
from agentscope_rft.engines.vllm_chat import VLLMCalls
from agentscope_rft.engines.vllm_env import find_vllm_python
from agentscope_rft.engines.vllm_launch import VLLMLaunch
from agentscope_rft.engines.vllm_replicas import Replica, ReplicaPool, SyncMode
from agentscope_rft.engines.vllm_server import OnRestart, VLLMServer, VLLMServerError, free_port
from agentscope_rft.engines.vllm_weights import ServedWeights, WeightPaths
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import SamplingParams

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

ChatRendering = Literal["engine", "vllm"]


class ReplicaHosts(Protocol):
    """Starts managed replicas somewhere other than as children of this process."""

    async def servers(
        self,
        launch: VLLMLaunch,
        count: int,
        *,
        log_dir: Path,
        port: int | None,
        startup_timeout: float,
        max_restarts: int,
        on_restart: OnRestart,
    ) -> list[VLLMServer]:
        """`count` supervised servers (not yet started), running `launch`."""
        ...


class VLLMEngine:
    """Serves a model from vLLM OpenAI servers that it starts and supervises (or connects to).

    Example:
        >>> engine = VLLMEngine("smollm2-135m-instruct", enforce_eager=True)  # doctest: +SKIP
        >>> await engine.start()  # doctest: +SKIP
        >>> outs = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8))  # doctest: +SKIP
        >>> seconds = await engine.load_weights(Path("ckpt/step-1"), version=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path = "smollm2-135m-instruct",
        *,
        served_model_name: str | None = None,
        python: str | Path | None = None,
        urls: Sequence[str] = (),
        replicas: int = 1,
        host: str = "127.0.0.1",
        port: int | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        seed: int = 0,
        kv_cache_space_gib: int = 2,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 600.0,
        max_restarts: int = 3,
        request_timeout: float = 600.0,
        sync_mode: SyncMode = "wait",
        chat_rendering: ChatRendering = "engine",
        tool_call_parser: str = "hermes",
        chat_template: str | None = None,
        reuse_prompt_tokens: bool = True,
        reasoning_parser: ReasoningParser = "auto",
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        weight_transfer: Literal["nccl"] | None = None,
        log_dir: str | Path | None = None,
        replica_gpus: Sequence[Sequence[int]] | None = None,
        gpu_memory_fraction: float | None = None,
        sleep_mode: bool = False,
    ) -> None:
        if sync_mode not in ("wait", "keep"):
            raise ValueError(f"sync_mode must be 'wait' or 'keep', got {sync_mode!r}")
        if chat_rendering not in ("engine", "vllm"):
            raise ValueError(f"chat_rendering must be 'engine' or 'vllm', got {chat_rendering!r}")
        if not urls and replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.model_path = resolve_model(model)
        self._model_name = served_model_name or str(model)
        self._python = python
        self._replica_gpus = [list(g) for g in replica_gpus] if replica_gpus else None
        self._gpu_memory_fraction = gpu_memory_fraction
        self._sleep_mode = sleep_mode
        self._urls = list(urls)
        self._num_replicas = len(self._urls) or replicas
        self._host = host
        self._port = port
        self._dtype = dtype
        self._max_model_len_override = max_model_len
        self._enforce_eager = enforce_eager
        self._seed = seed
        self._kv_cache_space_gib = kv_cache_space_gib
        self._extra_args = list(extra_args)
        self._env = dict(env or {})
        self._startup_timeout = startup_timeout
        self._max_restarts = max_restarts
        self._request_timeout = request_timeout
        self.sync_mode: SyncMode = sync_mode
        self.chat_rendering: ChatRendering = chat_rendering
        self._tool_call_parser = tool_call_parser
        self._chat_template = chat_template
        self._enable_lora = enable_lora
        self._max_lora_rank = max_lora_rank
        self._max_loras = max_loras
        self._weight_transfer = weight_transfer
        self.log_dir = Path(log_dir) if log_dir else None

        self.tokenizer = load_tokenizer(self.model_path)
        self.renderer = ChatRenderer(self.tokenizer, chat_template)
        self.prompts = PromptBuilder(self.renderer, reuse=reuse_prompt_tokens)

        self.pool = ReplicaPool()
        self.weights = ServedWeights(self.pool, self._model_name, max_loras=max_loras)
        self.calls = VLLMCalls(
            self.pool,
            self.weights,
            self.tokenizer,
            self.renderer,
            self.prompts,
            split_thinking=resolve_reasoning_parser(
                reasoning_parser, self.renderer.chat_template, self.tokenizer
            ),
        )
        self.replica_hosts: ReplicaHosts | None = None
        """Where managed replicas start: None: child processes of this one; set by the Ray runtime
        to start them under host actors on the cluster's nodes."""
        self.weight_paths: WeightPaths | None = None
        """Where each replica (by URL) reads a weights folder; None: the folder itself (set by
        the Ray runtime for replicas on other machines)."""
        self._tmp: Path | None = None

    # ------------------------------------------------------------------ properties
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def replicas(self) -> list[Replica]:
        """The replicas the engine calls (none until started)."""
        return self.pool.replicas

    @property
    def policy_version(self) -> int:
        return self.weights.version

    @property
    def max_model_len(self) -> int:
        return self.pool.max_model_len

    @property
    def active_model(self) -> str:
        """The model name calls are sent with: the base model, or the latest LoRA adapter."""
        return self.weights.active_model

    @property
    def sync_seconds(self) -> list[float]:
        """Seconds of every weight sync (reload or LoRA), pause included, in order."""
        return self.weights.sync_seconds

    @property
    def mixed_policy_calls(self) -> int:
        """Calls in flight across a full-weight reload in `keep` mode: sampled partly by the old
        weights and partly by the new ones (recorded with the version they were admitted under)."""
        return self.pool.mixed_policy_calls

    def forget_rollout(self, rollout_id: str) -> None:
        """Drop the rollout's turns kept for prompt-token reuse (it is closed: no more calls)."""
        self.prompts.forget(rollout_id)

    def metrics(self) -> dict[str, float]:
        """Counters for monitoring: syncs, last sync seconds, crashes and restarts."""
        return {
            "policy_version": float(self.policy_version),
            "in_flight": float(self.pool.in_flight),
            "syncs": float(len(self.sync_seconds)),
            "mixed_policy_calls": float(self.mixed_policy_calls),
            "last_sync_seconds": self.sync_seconds[-1] if self.sync_seconds else 0.0,
            "server_crashes": float(sum(r.server.crashes for r in self.replicas)),
            "server_restarts": float(sum(r.server.restarts for r in self.replicas)),
        }

    def check(self) -> None:
        """Raise `VLLMServerError` when a replica is gone for good (crashed past `max_restarts`,
        or a restart failed): its rollouts are routed to it by id, so every later step would fail
        its share of episodes.

        Example:
            >>> engine.check()  # doctest: +SKIP
        """
        failed = self.pool.failures()
        if failed:
            raise VLLMServerError(
                f"{len(failed)} of {len(self.replicas)} vLLM replica(s) gone for good, so the run "
                "stops here with its last checkpoint (fix the cause or raise engine.max_restarts, "
                f"then --resume): {failed[0]}"
            )

    @property
    def manages_servers(self) -> bool:
        """True when the engine starts its servers (False: it connects to `urls`)."""
        return not self._urls

    @property
    def weights_dir(self) -> Path | None:
        """The folder new weights are written under for the servers to reload (once started)."""
        return self._tmp

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return [self.calls.decode([tid], skip_special_tokens=False) for tid in token_ids]

    # ------------------------------------------------------------------ lifecycle
    @property
    def launch(self) -> VLLMLaunch:
        """How a managed replica is started (its command line and environment, as data)."""
        return VLLMLaunch(
            model_path=str(self.model_path),
            served_model_name=self._model_name,
            python=str(self._python) if self._python else None,
            dtype=self._dtype,
            seed=self._seed,
            tool_call_parser=self._tool_call_parser,
            max_model_len=self._max_model_len_override,
            enforce_eager=self._enforce_eager,
            chat_template=self._chat_template,
            enable_lora=self._enable_lora,
            max_lora_rank=self._max_lora_rank,
            max_loras=self._max_loras,
            weight_transfer=self._weight_transfer,
            kv_cache_space_gib=self._kv_cache_space_gib,
            extra_args=tuple(self._extra_args),
            env=dict(self._env),
            gpu_memory_fraction=self._gpu_memory_fraction,
            sleep_mode=self._sleep_mode,
        )

    def server_command(self, python: Path, port: int) -> list[str]:
        """The command line of one managed replica on this machine."""
        workdir = self._tmp or Path(tempfile.gettempdir())  # the chat template file goes here
        return self.launch.command(python, self._host, port, workdir)

    def server_env(self, replica: int = 0) -> dict[str, str]:
        """Replica `replica`'s environment (its GPUs only, under a `gpus:` placement)."""
        env = self.launch.environment(ipc_dir=self._tmp / "ipc" if self._tmp else None)
        if self._replica_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self._replica_gpus[replica])
        return env

    async def sleep(self) -> None:
        """Free the servers' GPU memory (weights to CPU, KV cache dropped) for a colocated
        trainer step; in-flight requests are drained first (none run during a step)."""
        await self.pool.on_all("/sleep", params={"level": "1"})
        logger.info(
            "vLLM asleep on %d replica(s): GPU memory freed for the trainer", len(self.replicas)
        )

    async def wake_up(self) -> None:
        """Take the GPU memory back after a colocated trainer step (before the weight sync)."""
        await self.pool.on_all("/wake_up")

    async def start(self) -> None:
        if self.replicas:
            return
        self._tmp = Path(tempfile.mkdtemp(prefix="agentscope-rft-vllm-"))
        log_dir = self.log_dir or self._tmp
        servers: list[VLLMServer] = []
        if self._urls:
            for i, url in enumerate(self._urls):
                servers.append(
                    VLLMServer(f"replica-{i}", url=url, startup_timeout=self._startup_timeout)
                )
        elif self.replica_hosts is not None:
            servers = await self.replica_hosts.servers(
                self.launch,
                self._num_replicas,
                log_dir=log_dir,
                port=self._port,
                startup_timeout=self._startup_timeout,
                max_restarts=self._max_restarts,
                on_restart=self.weights.reapply,
            )
        else:
            python = find_vllm_python(self._python)
            for i in range(self._num_replicas):
                port = self._port + i if self._port else free_port(self._host)
                env = self.server_env(i)
                servers.append(
                    VLLMServer(
                        f"replica-{i}",
                        url=f"http://{self._host}:{port}",
                        command=self.server_command(python, port),
                        env=env,
                        log_path=log_dir / f"vllm-replica-{i}.log",
                        startup_timeout=self._startup_timeout,
                        max_restarts=self._max_restarts,
                        on_restart=self.weights.reapply,
                    )
                )
        self.pool.replicas = [Replica(s, self._request_timeout) for s in servers]
        try:
            await asyncio.gather(*(s.start() for s in servers))
            await self.pool.discover_max_model_len(self._model_name)
        except BaseException:
            await self.close()
            raise
        logger.info(
            "vLLM engine ready: %s on %d replica(s) %s, max_model_len %d, chat rendering: %s",
            self.model_path.name,
            len(servers),
            ", ".join(s.url for s in servers),
            self.max_model_len,
            self.chat_rendering,
        )

    async def close(self) -> None:
        await self.pool.close()
        self.weights.drop_old(keep=None)
        if self._tmp is not None:
            # The servers' socket files are no use once they have ended. Without log_dir the logs
            # live in the temporary folder: keep it for post-mortems unless nothing is left in it.
            shutil.rmtree(self._tmp / "ipc", ignore_errors=True)
            if self.log_dir is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            elif self._tmp.is_dir() and not any(self._tmp.iterdir()):
                self._tmp.rmdir()
        self._tmp = None

    # ------------------------------------------------------------------ requests
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        return await self.calls.complete(prompt_ids, sampling, None)

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        calls = self.calls.chat_vllm if self.chat_rendering == "vllm" else self.calls.chat
        async for event in calls(request):
            yield event

    # ------------------------------------------------------------------ weights
    async def sync(
        self, version: int, apply: Callable[[], Awaitable[None]], *, pause_servers: bool = True
    ) -> float:
        """Run one weight sync: gate new calls, drain or freeze calls in flight (`sync_mode`),
        pause the servers, `await apply()`, reset prefix caches, resume, set `version`.

        The building block of `load_weights`, `load_lora` and the NCCL sender. Returns the
        seconds it took (recorded in `sync_seconds`).

        Example:
            >>> seconds = await engine.sync(2, send_weights)  # doctest: +SKIP
        """
        return await self.weights.sync(version, apply, self.sync_mode, pause_servers=pause_servers)

    async def load_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> float:
        """Swap in new weights as `version`: a state dict, an HF checkpoint folder, or (with
        `enable_lora`) a LoRA adapter folder.

        A state dict is first written as safetensors to a folder the servers read (it must be on
        a file system they share with this process). Returns the seconds the sync took, the
        writing included.
        """
        if isinstance(weights, Path) and (weights / "adapter_config.json").is_file():
            return await self.load_lora(weights, version)
        return await self.weights.load_full(
            weights, version, self.sync_mode, root=self._tmp, weight_paths=self.weight_paths
        )

    async def load_lora(self, adapter: Path, version: int) -> float:
        """Load a LoRA adapter folder as `version`; later calls use it (named by version).

        The base model stays served under `model_name`; the adapter is served as
        `<model_name>-lora-v<version>`. Needs `enable_lora=True`. Returns the seconds it took.
        """
        if not self._enable_lora and not self._urls:
            raise EngineError(
                "load_lora needs the engine started with enable_lora=True", status=400
            )
        if not (adapter / "adapter_config.json").is_file():
            raise EngineError(
                f"{adapter} has no adapter_config.json (not a LoRA adapter)", status=404
            )
        return await self.weights.load_lora(
            adapter, version, self.sync_mode, weight_paths=self.weight_paths
        )
