"""The embedded trainer: plain PyTorch (+ peft for LoRA) on CPU or one GPU.

One `step(samples)` is: drop zero-variance groups, compute reference/old log-probs and values
when the algorithm needs them, compute advantages, then for each epoch and mini-batch accumulate
`policy_objective` gradients over token-budgeted micro-batches and take one AdamW step. Log-probs
are computed only where tokens are trained (the vocabulary projection dominates the cost), with
each sample's sampling temperature, in fp32 from (optionally bf16-autocast) hidden states.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel

from agentscope_rft.algorithms import (
    AlgorithmConfig,
    LossInputs,
    loss_normalizers,
    policy_objective,
    rollout_seq_weights,
    value_loss,
)
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.engines.cpu_dtype import pick_dtype
from agentscope_rft.engines.embedded import pick_device
from agentscope_rft.models import load_causal_lm, load_tokenizer
from agentscope_rft.trainers.attention import use_training_attention
from agentscope_rft.trainers.batch import (
    TrainBatch,
    build_batch,
    group_prefix_length,
    micro_batches,
    shared_prefix_length,
)
from agentscope_rft.trainers.cast_linear import recast_linear_layers
from agentscope_rft.trainers.checkpoint import (
    load_trainer_state,
    merged_state_dict,
    save_hf_model,
    save_trainer_state,
)
from agentscope_rft.trainers.common import (
    LogprobGap,
    LRSchedule,
    batch_advantages,
    batch_metrics,
    filter_step_samples,
    mini_batch_rows,
    step_metrics,
    total_optimizer_steps,
)
from agentscope_rft.trainers.logprobs import KEEP_BYTES, token_logprobs_entropy
from agentscope_rft.trainers.memory_budget import (
    GIB,
    BudgetWatch,
    MemoryBudgetError,
    ModelFootprint,
    StepMeter,
    StepPlan,
    footprint_of,
    plan_step,
    room_above_fixed,
)
from agentscope_rft.trainers.optim import (
    BF16StateAdamW,
    optimizer_bytes_per_parameter,
    set_base_lrs,
)
from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)
_PROCESS_THREADS = torch.get_num_threads()
"""torch's CPU threads when this module was imported: the process default (OMP_NUM_THREADS or the
cores), before an engine thread set its own."""


def _unwrap(model: nn.Module) -> PreTrainedModel:
    """The HF model inside a peft wrapper (or the model itself)."""
    from peft import PeftModel

    inner = model.get_base_model() if isinstance(model, PeftModel) else model
    return cast(PreTrainedModel, inner)


@dataclass
class SharedPrefix:
    """Keys and values of a token prefix that every row of a (mini-)batch shares, computed once.

    In a gradient pass the rows attend to detached leaf copies; `backward()` then sends the
    gradients the leaves collected (over all micro-batches) through the prefix's own graph, so
    the weights get exactly the gradient that running the prefix once per row would give. With
    `recompute` set, the prefix ran without a graph (its activations are not held while the rows'
    passes run) and `backward()` first runs it again with one, from the same random state.
    """

    length: int
    keys_values: list[tuple[Tensor, Tensor]]
    graph_outputs: list[tuple[Tensor, Tensor]] | None = None
    recompute: Callable[[], list[tuple[Tensor, Tensor]]] | None = None

    def cache(self, rows: int) -> DynamicCache:
        """A fresh cache holding the prefix for `rows` rows (views, no copies)."""
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(self.keys_values):
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
        return cache

    def backward(self) -> None:
        graph = self.graph_outputs
        if graph is None and self.recompute is not None:
            if not any(leaf.grad is not None for pair in self.keys_values for leaf in pair):
                return
            graph = self.recompute()
        if graph is None:
            return
        outputs, grads = [], []
        for pair_out, pair_leaf in zip(graph, self.keys_values, strict=True):
            for out, leaf in zip(pair_out, pair_leaf, strict=True):
                if leaf.grad is not None:
                    outputs.append(out)
                    grads.append(leaf.grad)
        if outputs:
            torch.autograd.backward(outputs, grads)


def _can_share_prefix(config: TorchTrainerConfig, model: PreTrainedModel) -> bool:
    if not config.share_prefix:
        return False
    if config.gradient_checkpointing:
        logger.info("trainer.gradient_checkpointing is on: shared-prefix passes are off")
        return False
    text = model.config.get_text_config()
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(text, "use_sliding_window", False):
        logger.info("model has non-full-attention layers: shared-prefix passes are off")
        return False
    return True


class TorchTrainer:
    """Trains a causal LM with the configured algorithm.

    Example:
        >>> trainer = TorchTrainer(path, TorchTrainerConfig(lr=1e-5), AlgorithmConfig(),
        ...                        total_steps=100)  # doctest: +SKIP
        >>> metrics = trainer.step(samples, step=0)  # doctest: +SKIP
        >>> await engine.load_weights(trainer.state_dict_for_sync(), version=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        model_path: str | Path,
        config: TorchTrainerConfig,
        algorithm: AlgorithmConfig,
        *,
        total_steps: int,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.model_path = Path(model_path)
        self.config = config
        self.algorithm = algorithm
        self.device = pick_device(config.device)
        # torch's CPU thread count is per thread, and a thread inherits it from the one that last
        # set it: a worker started after the embedded engine's thread set its own count (cores - 1)
        # would train with that. Every step sets the trainer's count in the thread that runs it.
        self.num_threads = max(torch.get_num_threads(), _PROCESS_THREADS)
        self.autocast_dtype = self._autocast_dtype()
        self.pad_id = int(load_tokenizer(model_path).pad_token_id or 0)
        # A PreTrainedModel, or a peft wrapper around one: attributes mypy cannot see.
        model: Any = load_causal_lm(model_path, dtype=torch.float32, device=str(self.device))
        use_training_attention(model, self.device)  # CPU: no per-head K/V copies
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
            model.config.use_cache = False
        self.reference: nn.Module | None = None
        if algorithm.needs_reference() and config.lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if config.lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=config.lora.rank,
                    lora_alpha=config.lora.alpha,
                    lora_dropout=config.lora.dropout,
                    target_modules=config.lora.target_modules,
                    task_type="CAUSAL_LM",
                ),
            )
        self.model: Any = model.train()
        if self.autocast_dtype is not None:  # no bf16 copy of the weights kept for backward
            recast_linear_layers(self.model)
        self.share_prefix = _can_share_prefix(config, self._base())
        self.share_group_prefix = self.share_prefix and config.share_group_prefix
        hidden = int(self._base().config.get_text_config().hidden_size)
        self.value_head: nn.Linear | None = None
        groups: list[dict] = [
            {"params": [p for p in self.model.parameters() if p.requires_grad], "lr": config.lr}
        ]
        if algorithm.needs_critic():
            self.value_head = nn.Linear(hidden, 1).to(self.device)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
            groups.append(
                {
                    "params": list(self.value_head.parameters()),
                    "lr": config.lr * algorithm.critic.lr_multiplier,
                }
            )
        self.optimizer: torch.optim.Optimizer
        if config.optimizer_state_dtype == "bfloat16":
            self.optimizer = BF16StateAdamW(
                groups,
                lr=config.lr,
                betas=config.betas,
                weight_decay=config.weight_decay,
                seed=seed,
            )
        else:
            self.optimizer = torch.optim.AdamW(
                groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
            )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, LRSchedule.of(config, total_optimizer_steps(config, total_steps))
        )
        self._configured_lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        self.optimizer_steps = 0
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        self.footprint: ModelFootprint | None = None
        if config.memory_budget_gib is not None:
            compute_bytes = 4 if self.autocast_dtype is None else 2
            self.footprint = footprint_of(
                self._base(),
                trainable,
                self.reference is not None,
                compute_bytes,
                optimizer_bytes_per_parameter(config.optimizer_state_dtype),
            )
            # a budget below the fixed part is said now, not after the first step's episodes
            room_above_fixed(self.footprint, config.memory_budget_gib)
        self.plan = StepPlan(config.micro_batch_tokens, config.gradient_checkpointing)
        self.budget_watch = BudgetWatch()  # what steps measured above their plans
        measured = self.footprint is not None and config.memory_budget_measured
        self._meter = StepMeter(self.device) if measured else None
        if self._meter is not None:  # (read from disk lazily: the first step would count them)
            _fault_in(self.model)
        self._measured_steps = 0
        self._before_state: float | None = None  # a first step's peak before AdamW's state exists
        self._largest_pass = 0
        self._estimate_only = False  # (a partial hold-back is said once as a warning)
        logger.info(
            "torch trainer: %s on %s, compute %s, %.1fM trainable parameters%s",
            Path(model_path).name,
            self.device,
            str(self.autocast_dtype or torch.float32).removeprefix("torch."),
            trainable / 1e6,
            f", LoRA rank {config.lora.rank}" if config.lora else "",
        )

    # ------------------------------------------------------------------ set-up helpers
    def _autocast_dtype(self) -> torch.dtype | None:
        if self.config.dtype == "float32":
            return None
        if self.config.dtype == "bfloat16":
            return torch.bfloat16
        chosen = pick_dtype("auto", self.device)
        return chosen if chosen == torch.bfloat16 else None

    def _autocast(self) -> AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _base(self) -> PreTrainedModel:
        return _unwrap(self.model)

    def _reference_context(self) -> tuple[nn.Module, AbstractContextManager[object]]:
        if self.reference is not None:
            return self.reference, nullcontext()
        return self.model, self.model.disable_adapter()

    # ------------------------------------------------------------------ forward
    def _forward(
        self,
        model: nn.Module,
        mb: TrainBatch,
        *,
        entropy: bool,
        values: bool,
        prefix: SharedPrefix | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Per-token log-probs and entropy [b, t] at trained positions (0 elsewhere), values.

        With a `prefix`, only the tokens after it run through the model, attending to its cache;
        the prompt the rows share past it (`_group_prefix`) runs once too, in this pass's graph.
        """
        base = _unwrap(model)
        ids = mb.input_ids.to(self.device)
        cache, skip = self._group_prefix(base, mb, prefix)
        # Token i is predicted from the hidden state at i - 1, which is in the suffix for i > skip.
        trained = mb.loss_mask[:, skip + 1 :].bool().to(self.device)  # [b, t-skip-1]
        with self._autocast():
            hidden = base.get_decoder()(
                input_ids=ids[:, skip:],
                attention_mask=mb.attention_mask.to(self.device),
                past_key_values=cache,
                use_cache=cache is not None,
            ).last_hidden_state  # [b, t-skip, H]
        selected = hidden[:, :-1][trained]  # [M, H]
        temperature = mb.temperature.to(self.device).unsqueeze(1).expand_as(trained)[trained]
        targets = ids[:, skip + 1 :][trained]
        token_logprobs, token_entropy = self._token_logprobs(base, selected, targets, temperature)

        def place(per_token: Tensor) -> Tensor:
            """[M] values of the trained positions -> [b, t], 0 elsewhere."""
            full = ids.new_zeros(ids.shape, dtype=torch.float32)
            full[:, skip + 1 :][trained] = per_token
            return full

        if not entropy:
            token_entropy = token_entropy.detach()
        value_out = None
        if values:
            assert self.value_head is not None
            value_out = place(self.value_head(selected.float()).squeeze(-1))
        return place(token_logprobs), place(token_entropy), value_out

    def _grouping(self) -> bool:
        """Whether this step runs each group's shared prompt once (`trainer.share_group_prefix`;
        not under gradient checkpointing, which runs the model without a cache)."""
        return self.share_group_prefix and not self.plan.checkpointing

    def _group_length(self, mb: TrainBatch, skip: int) -> int:
        """Tokens past the shared prefix that the rows of micro-batch `mb` share and run once
        (0 when grouping is off or they share too few)."""
        return group_prefix_length(mb, skip) if self._grouping() else 0

    def _group_prefix(
        self, base: PreTrainedModel, mb: TrainBatch, prefix: SharedPrefix | None
    ) -> tuple[DynamicCache | None, int]:
        """The cache the rows of `mb` start from, and its length: the shared `prefix`, then the
        prompt all rows share past it (a GRPO group's task), run once for one row (with the
        graph when gradients are on: they reach the weights through the expanded keys and
        values exactly as if each row had run it)."""
        skip = prefix.length if prefix is not None else 0
        rows = len(mb.input_ids)
        extra = self._group_length(mb, skip)
        if not extra:
            return (prefix.cache(rows) if prefix is not None else None), skip
        ids = mb.input_ids[:1, skip : skip + extra].to(self.device)
        with self._autocast():
            cache = base.get_decoder()(
                input_ids=ids,
                attention_mask=mb.attention_mask[:1, : skip + extra].to(self.device),
                past_key_values=prefix.cache(1) if prefix is not None else None,
                use_cache=True,
            ).past_key_values
        expanded = DynamicCache()
        for layer, kv in enumerate(cache.layers):
            keys, values = kv.keys, kv.values
            expanded.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer)
        return expanded, skip + extra

    def _token_logprobs(
        self, base: PreTrainedModel, selected: Tensor, targets: Tensor, temperature: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and entropy [M] of `targets` through the output projection, in chunks (the
        [M, vocab] fp32 logits are never held whole, nor kept for backward)."""
        head = base.get_output_embeddings()
        dtype = self.autocast_dtype or torch.float32
        if type(head) is not nn.Linear:  # e.g. a LoRA-wrapped head: its own forward, unchunked
            with self._autocast():
                logits = head(selected)  # [M, V]
            logp = (logits.float() / temperature.unsqueeze(-1)).log_softmax(dim=-1)
            token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            return token, -(logp.exp() * logp).sum(-1)
        return token_logprobs_entropy(  # (casts the fp32 weights for its matmuls itself)
            selected.to(dtype),
            head.weight,
            head.bias,
            targets,
            temperature,
            keep_bytes=KEEP_BYTES if self.plan.keep_logprobs else 0,
        )

    def _shared_prefix(
        self, model: nn.Module, batch: TrainBatch, *, grad: bool
    ) -> SharedPrefix | None:
        """The prefix all rows of `batch` share, run once (None when sharing does not apply); in
        a gradient pass whose plan recomputes it, run without a graph and again in `backward()`."""
        sharing = self.share_prefix and not self.plan.checkpointing
        length = shared_prefix_length(batch) if sharing else 0
        if not length:
            return None
        ids = batch.input_ids[:1, :length].to(self.device)
        decoder = _unwrap(model).get_decoder()

        def run(with_graph: bool) -> list[tuple[Tensor, Tensor]]:
            with self._autocast(), nullcontext() if with_graph else torch.no_grad():
                cache = decoder(input_ids=ids, use_cache=True).past_key_values
            return [(layer.keys, layer.values) for layer in cache.layers]

        if not grad:
            return SharedPrefix(length, run(False))
        if not self.plan.recompute_prefix:
            computed = run(True)
            leaves = [
                (k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in computed
            ]
            return SharedPrefix(length, leaves, computed)
        # Dropout, if the model has any, draws the same numbers when the prefix runs again.
        cuda = self.device.type == "cuda"
        cpu_state = torch.random.get_rng_state()
        cuda_state = torch.cuda.get_rng_state(self.device) if cuda else None
        computed = run(False)

        def recompute() -> list[tuple[Tensor, Tensor]]:
            with torch.random.fork_rng(devices=[self.device] if cuda else []):
                torch.random.set_rng_state(cpu_state)
                if cuda_state is not None:
                    torch.cuda.set_rng_state(cuda_state, self.device)
                return run(True)

        leaves = [(k.requires_grad_(), v.requires_grad_()) for k, v in computed]
        return SharedPrefix(length, leaves, recompute=recompute)

    def _no_grad_pass(self, batch: TrainBatch, *, reference: bool) -> tuple[Tensor, Tensor | None]:
        """Log-probs (of the reference or current policy) and values over the whole batch."""
        logprobs = torch.zeros(batch.input_ids.shape)
        values = torch.zeros(batch.input_ids.shape) if self.value_head and not reference else None
        model, context = self._reference_context() if reference else (self.model, nullcontext())
        with torch.no_grad(), context:
            prefix = self._shared_prefix(model, batch, grad=False)
            skip = prefix.length if prefix is not None else 0
            for rows in micro_batches(
                batch, self.plan.micro_batch_tokens, skip, families=self._grouping()
            ):
                mb = batch.select(rows)
                lp, _, vals = self._forward(
                    model, mb, entropy=False, values=values is not None, prefix=prefix
                )
                width = mb.input_ids.shape[1]
                logprobs[rows, :width] = lp.cpu()
                if values is not None and vals is not None:
                    values[rows, :width] = vals.cpu()
        return logprobs, values

    # ------------------------------------------------------------------ training step
    def step(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        """One training step on a batch; returns metrics (see docs/monitoring.md for names).

        A batch of SFT demonstrations only (an exploring run's `offline.warmup_steps`) trains
        with the `sft` objective whatever `algorithm.objective` is.
        """
        if self.device.type == "cpu" and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        configured = self.algorithm
        if configured.objective != "sft" and samples and all(s.kind == "sft" for s in samples):
            self.algorithm = configured.model_copy(update={"objective": "sft"})
            try:
                return self._step(samples, step)
            finally:
                self.algorithm = configured
        return self._step(samples, step)

    def _step(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        started = time.perf_counter()
        samples, metrics = filter_step_samples(samples, self.algorithm, self.pad_id, step)
        if not samples:
            return {**metrics, "time/train": time.perf_counter() - started}
        batch = build_batch(samples, self.pad_id, self.config.max_seq_len)
        self._keep_budget(batch, step)
        if self._meter is not None:
            self._meter.start()
            self._largest_pass = 0  # tokens of the step's largest gradient pass (`_update`)
            self._before_state = None
        algo = self.algorithm
        ref = self._no_grad_pass(batch, reference=True)[0] if algo.needs_reference() else None
        old_values = None
        if self.config.old_logprobs == "recompute" or self.value_head is not None:
            current, old_values = self._no_grad_pass(batch, reference=False)
            old = current if self.config.old_logprobs == "recompute" else batch.rollout_logprobs
        else:
            old = batch.rollout_logprobs
        advantages, returns = batch_advantages(batch, old, ref, old_values, algo, metrics)
        seq_weights = rollout_seq_weights(batch.episode_ids) if algo.normalize_per_rollout else None

        sums: dict[str, float] = defaultdict(float)
        gap = LogprobGap.of(batch, version=step)  # engine vs trainer, before the first update
        parts = mini_batch_rows(batch, self.config.mini_batches)
        for epoch in range(self.config.epochs):
            for index, mini in enumerate(parts):
                first = gap if epoch == 0 and index == 0 else None
                self._update(
                    batch, mini, old, ref, advantages, returns, old_values, seq_weights, sums, first
                )
        updates = self.config.epochs * len(parts)
        metrics.update(step_metrics(sums, updates, batch, time.perf_counter() - started))
        recomputed = self.config.old_logprobs == "recompute"
        metrics.update(batch_metrics(batch, old, ref, recomputed, gap))
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        self._measure_budget(step, metrics)
        return metrics

    def _measure_budget(self, step: int, metrics: dict[str, float]) -> None:
        """Compare what the step added to memory with its plan; a step over it makes every later
        plan hold the difference back (`trainer.memory_budget_measured`)."""
        added = self._meter.stop() if self._meter is not None else None
        if added is None:
            return
        metrics["train/memory_step_gib"] = added / GIB
        self._measured_steps += 1
        if self._before_state is not None:  # AdamW's state, allocated in this step, not counted
            added = self._before_state
        elif self._measured_steps == 1:  # (a first step whose state could not be set apart)
            return
        planned = self.plan.expected_bytes(self._largest_pass)
        if self.budget_watch.observe(planned, added):
            logger.info(
                "step %d: the trainer's step added %.2f GiB at its peak, %.2f GiB more than "
                "planned; later steps hold that back from trainer.memory_budget_gib=%g",
                step,
                added / GIB,
                self.budget_watch.overshoot_bytes / GIB,
                self.config.memory_budget_gib,
            )
        metrics["train/memory_overshoot_gib"] = self.budget_watch.overshoot_bytes / GIB

    def _keep_budget(self, batch: TrainBatch, step: int) -> None:
        """Pick this step's micro-batch size and checkpointing under `memory_budget_gib`."""
        if self.footprint is None or self.config.memory_budget_gib is None:
            return
        budget, configured = self.config.memory_budget_gib, self.config.micro_batch_tokens
        longest = int(batch.lengths.max())
        shared = shared_prefix_length(batch) if self.share_prefix else 0
        suffix = float((batch.lengths - shared).float().mean())
        per_row = self.footprint.prefix_kv_bytes(shared) / max(suffix, 1.0)
        footprint = self.footprint

        def planned(over: float) -> StepPlan:
            plan = plan_step(footprint, budget, configured, longest - shared, shared, per_row, over)
            if plan.checkpointing and not self.config.gradient_checkpointing and shared:
                # no prefix pass then
                plan = plan_step(footprint, budget, configured, longest, overshoot_bytes=over)
            return plan

        over = self.budget_watch.overshoot_bytes
        plan = planned(0.0)
        if over and not plan.checkpointing:
            held = _held_back(planned, over)
            if held < over:
                # Holding back all that was measured would need gradient checkpointing (or not
                # fit at all) where the estimate does not: the smallest passes without it.
                log = logger.info if self._estimate_only else logger.warning
                log(
                    "step %d: holding back %.2f of the %.2f GiB that steps measured above their "
                    "plans: more would need gradient checkpointing (1.5x+ the step time) under "
                    "trainer.memory_budget_gib=%g; raise the budget to keep it as measured",
                    step,
                    held / GIB,
                    over / GIB,
                    budget,
                )
                self._estimate_only = True
            plan = planned(held)
        if self.config.gradient_checkpointing:
            plan = dataclasses.replace(plan, checkpointing=True, recompute_prefix=False)
        elif plan.checkpointing != self.plan.checkpointing:
            base = self._base()
            if plan.checkpointing:
                base.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                base.gradient_checkpointing_disable()
        if plan != self.plan:
            logger.info(
                "step %d: trainer.memory_budget_gib=%g -> micro-batches of %d tokens%s%s%s "
                "(longest sample %d tokens)",
                step,
                budget,
                plan.micro_batch_tokens,
                "" if plan.keep_logprobs else ", log-probs recomputed in backward",
                ", shared prefix recomputed for its backward" if plan.recompute_prefix else "",
                ", gradient checkpointing on" if plan.checkpointing else "",
                longest,
            )
        self.plan = plan

    def _update(
        self,
        batch: TrainBatch,
        mini: list[int],
        old: Tensor,
        ref: Tensor | None,
        advantages: Tensor,
        returns: Tensor | None,
        old_values: Tensor | None,
        seq_weights: Tensor | None,
        sums: dict[str, float],
        gap: LogprobGap | None = None,
    ) -> None:
        """One optimizer step over the mini-batch `mini` (rows of `batch`); `gap` (the step's
        first update) sums |trainer - engine| log-probs of the trained tokens of `gap.rows`."""
        algo = self.algorithm
        part = batch.select(mini)
        weights = seq_weights[mini] if seq_weights is not None else None
        norms = loss_normalizers(part.loss_mask, algo, weights, part.sample_kinds)
        self.optimizer.zero_grad(set_to_none=True)
        prefix = self._shared_prefix(self.model, part, grad=True)
        skip = prefix.length if prefix is not None else 0
        sums["train/shared_prefix_tokens"] += float(skip)
        families = self._grouping()
        for local in micro_batches(part, self.plan.micro_batch_tokens, skip, families=families):
            mb = part.select(local)
            self._largest_pass = max(
                self._largest_pass, len(local) * (int(mb.lengths.max()) - skip)
            )
            rows = [mini[i] for i in local]
            sums["train/group_prefix_tokens"] += float(self._group_length(mb, skip))
            width = mb.input_ids.shape[1]
            logprobs, entropy, values = self._forward(
                self.model,
                mb,
                entropy=algo.needs_entropy(),
                values=self.value_head is not None,
                prefix=prefix,
            )
            dev = self.device
            inputs = LossInputs(
                logprobs=logprobs,
                old_logprobs=old[rows, :width].to(dev),
                rollout_logprobs=mb.rollout_logprobs.to(dev),
                advantages=advantages[rows, :width].to(dev),
                loss_mask=mb.loss_mask.to(dev),
                global_num_tokens=norms.num_tokens,
                global_num_seqs=norms.num_seqs,
                global_num_sft_tokens=norms.num_sft_tokens,
                seq_weights=weights[local].to(dev) if weights is not None else None,
                ref_logprobs=ref[rows, :width].to(dev) if ref is not None else None,
                entropy=entropy if algo.needs_entropy() else None,
                sample_kinds=mb.sample_kinds.to(dev),
                pair_index=mb.pair_index.to(dev),
                is_chosen=mb.is_chosen.to(dev),
            )
            loss, shares = policy_objective(inputs, algo, self.optimizer_steps)
            if values is not None and returns is not None and old_values is not None:
                vloss, vshares = value_loss(
                    values,
                    old_values[rows, :width].to(dev),
                    returns[rows, :width].to(dev),
                    mb.loss_mask.to(dev),
                    algo,
                    norms.num_tokens,
                )
                loss = loss + vloss
                shares = {**shares, **vshares}
            loss.backward()
            sums["loss"] += float(loss.detach())
            trained = mb.loss_mask.to(dev).bool()
            sums["entropy/sum"] += float(entropy.detach()[trained].sum())
            sums["entropy/tokens"] += float(trained.sum())
            if gap is not None:
                sampled = trained & gap.rows[rows].to(dev)[:, None]
                diff = (logprobs.detach() - mb.rollout_logprobs.to(dev)).abs()
                gap.sum += float(diff[sampled].sum())
                gap.tokens += float(sampled.sum())
            for key, value in shares.items():
                sums[key] += value
        if prefix is not None:
            prefix.backward()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        clip = self.config.grad_clip or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"non-finite gradient norm ({grad_norm}); lower trainer.lr")
        if self._meter is not None and not self.optimizer.state and self._before_state is None:
            self._before_state = self._meter.so_far()  # (the step below allocates AdamW's state)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # gradients are not kept between steps
        self.scheduler.step()
        self.optimizer_steps += 1
        sums["grad_norm"] += float(grad_norm)

    def adjust(self, lr_scale: float, algorithm: AlgorithmConfig) -> None:
        """Train from now on at `lr_scale` x the configured learning rate (the schedule goes on
        from where it is) with `algorithm` (a health rollback's changes: KL, entropy bonus)."""
        set_base_lrs(
            self.optimizer, self.scheduler, [base * lr_scale for base in self._configured_lrs]
        )
        if algorithm.needs_reference() and self.reference is None and self.config.lora is None:
            # A KL added by a rollback: the reference is the starting policy, as if configured.
            reference = load_causal_lm(
                self.model_path, dtype=torch.float32, device=str(self.device)
            )
            self.reference = reference.eval().requires_grad_(False)
        self.algorithm = algorithm

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self) -> dict[str, Tensor]:
        """Full HF-named weights of the current policy (LoRA merged), for the inference engine."""
        return merged_state_dict(self.model)

    def export_hf(self, target: Path) -> None:
        save_hf_model(self, target, self.model_path)

    def save(self, directory: Path) -> None:
        save_trainer_state(self, directory)

    def load(self, directory: Path) -> None:
        load_trainer_state(self, directory)

    def close(self) -> None:
        if self._meter is not None:
            self._meter.close()


def _fault_in(model: nn.Module) -> None:
    """Read one value per memory page of every weight: weights mapped from their files are read
    from disk when first used, and the first step's measured memory would count them."""
    with torch.no_grad():
        for param in model.parameters():
            if param.device.type == "cpu" and param.numel():
                torch.sum(param.detach().reshape(-1)[:: 4096 // param.element_size()])


def _held_back(planned: Callable[[float], StepPlan], over: float) -> float:
    """The most of `over` bytes a plan can hold back without gradient checkpointing (`planned`
    without any needs none), to 1/64 of `over`."""
    try:
        if not planned(over).checkpointing:
            return over
    except MemoryBudgetError:
        pass
    low, high = 0.0, over
    for _ in range(6):
        middle = (low + high) / 2
        try:
            fits = not planned(middle).checkpointing
        except MemoryBudgetError:
            fits = False
        low, high = (middle, high) if fits else (low, middle)
    return low


def weights_changed(before: Mapping[str, Tensor], after: Mapping[str, Tensor]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)
