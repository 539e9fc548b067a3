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
  streamed tool-call token ids to lose.
- **Replicas.** Each rollout sticks to one replica (a stable hash of its id) so its prefix cache
  is reused; calls without a rollout go to the least busy replica.
- **Weight sync.** `load_weights` closes the gate for new calls, drains in-flight calls
  (`sync_mode="wait"`) or freezes them (`"keep"`), reloads weights from a checkpoint folder on
  every replica (`/collective_rpc reload_weights`), resets the prefix cache, resumes and bumps the
  version. `load_lora` loads a LoRA adapter named by version instead. NCCL transfer from a trainer
  on other GPUs is in `vllm_nccl.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import httpx

from agentscope_rft.chat.template import (
    ChatFormatError,
    ChatRenderer,
    normalize_messages,
    normalize_tools,
)
from agentscope_rft.engines import vllm_wire as wire
from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    ContentDelta,
    ContextWindowError,
    EngineError,
    GenerationOutput,
    PromptReady,
    completion_room,
)
from agentscope_rft.engines.chat import PromptBuilder, assemble_choice
from agentscope_rft.engines.vllm_env import find_vllm_python
from agentscope_rft.engines.vllm_launch import VLLMLaunch
from agentscope_rft.engines.vllm_server import OnRestart, VLLMServer, VLLMServerError, free_port
from agentscope_rft.models import load_tokenizer, resolve_model
from agentscope_rft.types import JSON, SamplingParams

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SyncMode = Literal["wait", "keep"]
ChatRendering = Literal["engine", "vllm"]


def save_weights(weights: Mapping[str, torch.Tensor], folder: Path) -> None:
    """Write a state dict as `folder/model.safetensors`, the layout the servers reload from.

    Tied weights (one storage under two names) are copied: safetensors refuses shared storage.

    Example:
        >>> save_weights(model.state_dict(), Path("weights-v3"))  # doctest: +SKIP
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in weights.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    save_file(tensors, str(folder / "model.safetensors"))


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


class _Replica:
    def __init__(self, server: VLLMServer, request_timeout: float) -> None:
        self.server = server
        self.in_flight = 0
        self.http = httpx.AsyncClient(
            base_url=server.url, timeout=httpx.Timeout(request_timeout, connect=10.0)
        )


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
        kv_cache_space_gib: float = 2.0,
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
        self._stop_ids = {int(self.tokenizer.eos_token_id), self.renderer.end_of_turn_id}

        self.replicas: list[_Replica] = []
        self.replica_hosts: ReplicaHosts | None = None
        """Where managed replicas start: None: child processes of this one; set by the Ray runtime
        to start them under host actors on the cluster's nodes."""
        self.weight_paths: Callable[[Path, int], Awaitable[Mapping[str, Path]]] | None = None
        """Where each replica (by URL) reads a weights folder; None: the folder itself (set by
        the Ray runtime for replicas on other machines)."""
        self._max_model_len = 0
        self._version = 0
        self._active_model = self._model_name
        self._weights_path: Path | None = None
        self._replica_weights: dict[str, Path] = {}  # replica URL -> its copy of the weights
        self._owned_weights: list[Path] = []
        self._loras: list[tuple[str, dict[str, Path]]] = []  # name, replica URL -> its folder
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self._sync_lock = asyncio.Lock()
        self._tmp: Path | None = None
        self._reloads = 0
        self.mixed_policy_calls = 0
        """Calls in flight across a full-weight reload in `keep` mode: sampled partly by the old
        weights and partly by the new ones (recorded with the version they were admitted under)."""
        self.sync_seconds: list[float] = []
        """Seconds of every weight sync (reload or LoRA), pause included, in order."""

    # ------------------------------------------------------------------ properties
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        if not self.replicas:
            raise EngineError("the engine is not started (await engine.start())", status=503)
        return self._max_model_len

    @property
    def active_model(self) -> str:
        """The model name calls are sent with: the base model, or the latest LoRA adapter."""
        return self._active_model

    def metrics(self) -> dict[str, float]:
        """Counters for monitoring: syncs, last sync seconds, crashes and restarts."""
        return {
            "policy_version": float(self._version),
            "in_flight": float(self._in_flight),
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
        failed = [r.server.failure for r in self.replicas if r.server.failure is not None]
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
        return [self._decode([tid], skip_special_tokens=False) for tid in token_ids]

    def _decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text = self.tokenizer.decode(
            list(token_ids),
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        assert isinstance(text, str)
        return text

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
        env = self.launch.environment()
        if self._replica_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self._replica_gpus[replica])
        return env

    async def sleep(self) -> None:
        """Free the servers' GPU memory (weights to CPU, KV cache dropped) for a colocated
        trainer step; in-flight requests are drained first (none run during a step)."""
        await self._on_all("/sleep", params={"level": "1"})
        logger.info(
            "vLLM asleep on %d replica(s): GPU memory freed for the trainer", len(self.replicas)
        )

    async def wake_up(self) -> None:
        """Take the GPU memory back after a colocated trainer step (before the weight sync)."""
        await self._on_all("/wake_up")

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
                on_restart=self._reapply_weights,
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
                        on_restart=self._reapply_weights,
                    )
                )
        self.replicas = [_Replica(s, self._request_timeout) for s in servers]
        try:
            await asyncio.gather(*(s.start() for s in servers))
            await self._discover_max_model_len()
        except BaseException:
            await self.close()
            raise
        logger.info(
            "vLLM engine ready: %s on %d replica(s) %s, max_model_len %d, chat rendering: %s",
            self.model_path.name,
            len(servers),
            ", ".join(s.url for s in servers),
            self._max_model_len,
            self.chat_rendering,
        )

    async def _discover_max_model_len(self) -> None:
        replica = self.replicas[0]
        response = await replica.http.get("/v1/models")
        if response.status_code != 200:
            raise wire.api_error(response, replica.server.describe())
        served = {m["id"]: m for m in response.json().get("data", [])}
        if self._model_name not in served:
            raise VLLMServerError(
                f"{replica.server.describe()} does not serve {self._model_name!r} (it serves "
                f"{sorted(served)}): the engine asks for model.name_or_path; start that server "
                f"with --served-model-name {self._model_name} (with the same weights), or fix "
                "engine.urls"
            )
        self._max_model_len = int(served[self._model_name].get("max_model_len") or 0)

    async def close(self) -> None:
        replicas, self.replicas = self.replicas, []
        for replica in replicas:
            await replica.server.stop()
            await replica.http.aclose()
        self._drop_old_weights(keep=None)
        # Without log_dir the logs live in the temporary folder: keep them for post-mortems.
        if self._tmp is not None and self.log_dir is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    # ------------------------------------------------------------------ requests
    def _pick(self, rollout_id: str | None) -> _Replica:
        if not self.replicas:
            raise EngineError("the engine is not started (await engine.start())", status=503)
        if rollout_id is not None:
            return self.replicas[zlib.crc32(rollout_id.encode()) % len(self.replicas)]
        return min(self.replicas, key=lambda r: r.in_flight)

    @contextlib.asynccontextmanager
    async def _admitted(self, replica: _Replica) -> AsyncIterator[tuple[int, str]]:
        """Admit one call past the sync gate; yields (policy version, model name) to use.

        The version is the one current at admission: in `keep` mode a call that a reload
        interrupts records it although its later tokens come from the new weights (its log-probs
        are those of the weights that sampled each token); `mixed_policy_calls` counts them.
        """
        while not self._gate.is_set():
            await self._gate.wait()
        self._in_flight += 1
        replica.in_flight += 1
        self._idle.clear()
        reloads = self._reloads
        try:
            yield self._version, self._active_model
        finally:
            if self._reloads != reloads:  # only possible in keep mode: wait mode drains first
                self.mixed_policy_calls += 1
            self._in_flight -= 1
            replica.in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def _post(
        self,
        replica: _Replica,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        await replica.server.ready()
        try:
            response = await replica.http.post(path, json=body, params=params)
        except httpx.TransportError as exc:
            raise await replica.server.request_failed(exc) from exc
        if response.status_code >= 400:
            raise wire.api_error(response, replica.server.describe())
        if "json" not in response.headers.get("content-type", ""):
            return response.text  # e.g. /v1/load_lora_adapter answers in plain text
        return response.json()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        return await self._complete(prompt_ids, sampling, None)

    async def _complete(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        rollout_id: str | None,
        response_format: JSON | None = None,
    ) -> list[GenerationOutput]:
        max_tokens = completion_room(len(prompt_ids), self.max_model_len, sampling.max_tokens)
        replica = self._pick(rollout_id)
        async with self._admitted(replica) as (version, model):
            body = self._stop_at_turn_end(
                wire.completions_body(model, prompt_ids, sampling, max_tokens), sampling
            )
            if response_format is not None:
                body["response_format"] = response_format
            data = await self._post(replica, "/v1/completions", body)
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        return [wire.parse_completion(c, sampling.top_logprobs, version) for c in choices]

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        if self.chat_rendering == "vllm":
            async for event in self._chat_vllm(request):
                yield event
            return
        try:
            prompt_ids, reused = self.prompts.build(request)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        completion_room(len(prompt_ids), self.max_model_len, request.sampling.max_tokens)
        yield PromptReady(prompt_ids=prompt_ids, reused_tokens=reused)
        outputs = await self._complete(
            prompt_ids, request.sampling, request.rollout_id, request.response_format
        )
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        choices = [
            assemble_choice(
                index, output, self.tokenizer, self._stop_ids, parse_tools,
                id_prefix=f"call_{request.request_id or uuid.uuid4().hex[:8]}",
            )
            for index, output in enumerate(outputs)
        ]  # fmt: skip
        for choice in choices:
            if request.stream and choice.content:
                yield ContentDelta(index=choice.index, text=choice.content)
            yield ChoiceDone(choice)
        self.prompts.remember(request, prompt_ids, choices)

    def _stop_at_turn_end(self, body: JSON, sampling: SamplingParams) -> JSON:
        """`body` stopping at the chat template's end of turn where the model's eos differs (a
        base model's tokenizer with a ChatML template: eos <|endoftext|>, turns <|im_end|>),
        as the embedded engine does; not with `ignore_eos`, which ignores both there."""
        if self.renderer.end_of_turn_id != self.tokenizer.eos_token_id and not sampling.ignore_eos:
            body["stop_token_ids"] = [self.renderer.end_of_turn_id]
        return body

    async def _chat_vllm(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        try:  # the same validation (and error messages) as the engine's own rendering
            normalize_messages(request.messages)
            normalize_tools(request.tools)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        sampling = request.sampling
        replica = self._pick(request.rollout_id)
        max_tokens = min(sampling.max_tokens or self.max_model_len, self.max_model_len)
        async with self._admitted(replica) as (version, model):
            body = self._stop_at_turn_end(
                wire.chat_body(
                    model,
                    request.messages,
                    request.tools,
                    request.tool_choice,
                    sampling,
                    max_tokens,
                ),
                sampling,
            )
            if request.response_format is not None:
                body["response_format"] = request.response_format
            try:
                data = await self._post(replica, "/v1/chat/completions", body)
            except ContextWindowError as exc:
                # vLLM renders the prompt here, so only its refusal tells how long it is; a
                # max_tokens past the window is an upper bound, as on the engine's own rendering
                room = wire.room_left(str(exc), self.max_model_len)
                if room is None or room >= max_tokens:
                    raise
                body["max_tokens"] = room
                data = await self._post(replica, "/v1/chat/completions", body)
        yield PromptReady(prompt_ids=[int(t) for t in data.get("prompt_token_ids") or []])
        for raw in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            ids, logprobs, top, content, tool_calls = wire.parse_chat_choice(
                raw, sampling.top_logprobs
            )
            text_ids = ids[:-1] if ids and ids[-1] in self._stop_ids else ids
            text = self._decode(text_ids)
            stop = wire.stop_string(raw)
            if stop is not None and stop in text:
                text = text[: text.find(stop)]
            choice = ChoiceResult(
                index=int(raw.get("index", 0)),
                completion_ids=ids,
                logprobs=logprobs,
                finish_reason=wire.finish_reason(raw),
                policy_version=version,
                text=text,
                content=content if content or not tool_calls else None,
                tool_calls=tool_calls,
                top_logprobs=top,
            )
            if request.stream and choice.content:
                yield ContentDelta(index=choice.index, text=choice.content)
            yield ChoiceDone(choice)

    # ------------------------------------------------------------------ weights
    @contextlib.asynccontextmanager
    async def _paused(self, *, pause_servers: bool) -> AsyncIterator[None]:
        """Hold new calls at the gate; drain (wait) or freeze (keep) the ones in flight."""
        async with self._sync_lock:
            self._gate.clear()
            try:
                if self.sync_mode == "wait":
                    await self._idle.wait()
                if pause_servers:
                    await self._on_all("/pause", params={"mode": self.sync_mode})
                try:
                    yield
                finally:
                    if pause_servers:
                        await self._on_all(
                            "/reset_prefix_cache",
                            # Frozen calls are preempted and recompute their KV on the new weights.
                            params={
                                "reset_running_requests": str(self.sync_mode == "keep").lower()
                            },
                        )
                        await self._on_all("/resume")
            finally:
                self._gate.set()

    async def _on_all(
        self, path: str, body: Any = None, params: Mapping[str, str] | None = None
    ) -> list[Any]:
        return list(
            await asyncio.gather(*(self._post(r, path, body, params) for r in self.replicas))
        )

    async def sync(
        self, version: int, apply: Callable[[], Awaitable[None]], *, pause_servers: bool = True
    ) -> float:
        """Run one weight sync: gate new calls, drain or freeze calls in flight (`sync_mode`),
        pause the servers, `await apply()`, reset prefix caches, resume, set `version`.

        The building block of `load_weights`, `load_lora` and the NCCL sender. Returns the
        seconds it took (recorded in `sync_seconds`).
        """
        started = time.perf_counter()
        async with self._paused(pause_servers=pause_servers):
            if pause_servers:  # full weights change under any call frozen in flight
                self._reloads += 1
            await apply()
            self._version = version
        elapsed = time.perf_counter() - started
        self.sync_seconds.append(elapsed)
        return elapsed

    async def load_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> float:
        """Swap in new weights as `version`: a state dict, an HF checkpoint folder, or (with
        `enable_lora`) a LoRA adapter folder.

        A state dict is first written as safetensors to a folder the servers read (it must be on
        a file system they share with this process). Returns the seconds the sync took, the
        writing included.
        """
        if isinstance(weights, Path) and (weights / "adapter_config.json").is_file():
            return await self.load_lora(weights, version)
        started = time.perf_counter()
        folder = await asyncio.to_thread(self._weights_folder, weights, version)
        # Replicas on other machines may read a copy of the folder (see runtime/ray/weights.py).
        paths = await self.weight_paths(folder, version) if self.weight_paths else {}

        where = {r.server.url: paths.get(r.server.url, folder) for r in self.replicas}

        async def reload() -> None:
            await asyncio.gather(
                *(
                    self._post(
                        replica,
                        "/collective_rpc",
                        {
                            "method": "reload_weights",
                            "kwargs": {"weights_path": str(where[replica.server.url])},
                        },
                    )
                    for replica in self.replicas
                )
            )
            self._weights_path = folder
            self._replica_weights = where
            self._active_model = self._model_name  # full weights replace any adapter

        await self.sync(version, reload)
        self._drop_old_weights(keep=folder)
        elapsed = time.perf_counter() - started
        self.sync_seconds[-1] = elapsed
        logger.info("vLLM weights v%d loaded from %s in %.2f s", version, folder, elapsed)
        return elapsed

    def _weights_folder(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> Path:
        if isinstance(weights, Path):
            if not any(weights.glob("*.safetensors")):
                raise EngineError(f"no *.safetensors files in {weights}", status=404)
            return weights.resolve()
        assert self._tmp is not None, "the engine is not started"
        folder = Path(tempfile.mkdtemp(prefix=f"weights-v{version}-", dir=self._tmp))
        save_weights(weights, folder)
        self._owned_weights.append(folder)
        return folder

    def _drop_old_weights(self, keep: Path | None) -> None:
        for folder in [f for f in self._owned_weights if f != keep]:
            shutil.rmtree(folder, ignore_errors=True)
            self._owned_weights.remove(folder)

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
        name = f"{self._model_name}-lora-v{version}"
        path = adapter.resolve()
        # Replicas on other machines may read a copy of the folder (see runtime/ray/weights.py).
        paths = await self.weight_paths(path, version) if self.weight_paths else {}
        where = {r.server.url: paths.get(r.server.url, path) for r in self.replicas}

        async def load() -> None:
            await asyncio.gather(
                *(
                    self._post(
                        r,
                        "/v1/load_lora_adapter",
                        {"lora_name": name, "lora_path": str(where[r.server.url])},
                    )
                    for r in self.replicas
                )
            )
            self._loras.append((name, where))
            self._active_model = name

        # No server pause: calls in flight keep their adapter; the gate orders the switch.
        elapsed = await self.sync(version, load, pause_servers=False)
        for old, _ in self._loras[: -self._max_loras]:
            with contextlib.suppress(EngineError):
                await self._on_all("/v1/unload_lora_adapter", {"lora_name": old})
        del self._loras[: -self._max_loras]
        logger.info("vLLM LoRA adapter %s loaded from %s in %.2f s", name, adapter, elapsed)
        return elapsed

    async def _reapply_weights(self, server: VLLMServer) -> None:
        """After a restart the server has the base weights: load the current ones again."""
        replica = next(r for r in self.replicas if r.server is server)

        async def post(path: str, body: Any) -> None:
            response = await replica.http.post(path, json=body)
            if response.status_code >= 400:
                raise wire.api_error(response, server.describe())

        if self._weights_path is not None:
            path = self._replica_weights.get(server.url, self._weights_path)
            await post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
            )
        for name, paths in self._loras:
            lora_path = str(paths[server.url])
            await post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": lora_path})
        logger.info("%s restarted with policy version %d", server.describe(), self._version)
