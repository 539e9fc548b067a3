"""The `trainer:` section of a run config: the torch trainer or verl (and LoRA)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from agentscope_rft.config_base import Section


class LoRAConfig(Section):
    """Low-rank adapters (peft) instead of full fine-tuning."""

    rank: int = Field(default=16, ge=1, le=1024)
    """Adapter rank r."""
    alpha: int = Field(default=32, gt=0)
    """Adapter scaling alpha (the update is scaled by alpha / r)."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter input."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt (each must name layers of the model, e.g. `q_proj` or
    `self_attn.v_proj`: checked before the run starts), or `all-linear`."""


class TrainerSettings(Section):
    """What every trainer backend means the same way: optimizer, schedule, batching, model.

    `TorchTrainerConfig` and `VerlTrainerConfig` extend it with their own placement keys, so a run
    switches backends by changing `type` (and adding placement keys), not by renaming settings.
    """

    lr: float = Field(default=1e-6, gt=0)
    """Peak learning rate of the policy (AdamW)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up, over the run's steps."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warm-up from near zero to `lr`."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Floor of linear/cosine decay, as a fraction of `lr`."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    grad_clip: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this (null: no clipping)."""
    micro_batch_tokens: int = Field(default=8192, ge=16)
    """Tokens per forward/backward pass; gradients accumulate across micro-batches. torch: padded
    tokens (rows x longest); verl: real tokens per rank (its dynamic batching packs rows)."""
    mini_batches: int = Field(default=1, ge=1)
    """Optimizer steps per training step: the batch is split into this many parts, at random
    (a DPO pair's two samples stay together; samples without trained tokens go to none; fewer
    parts when there are fewer samples)."""
    epochs: int = Field(default=1, ge=1)
    """Passes over each batch (PPO epochs)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype; weights and optimizer stay fp32. `auto`: bf16 where it is faster (CUDA with
    bf16; on CPU as the embedded engine's `dtype: auto` decides: bf16 instructions and faster
    matmuls), else fp32."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward: less memory, ~30% more time."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters instead of all weights (null: full fine-tuning)."""
    old_logprobs: Literal["rollout", "recompute"] = "rollout"
    """Behaviour policy for the importance ratio: the engine's recorded log-probs, or log-probs
    recomputed by the trainer before the update (then TIS, if on, corrects rollout vs trainer)."""
    max_seq_len: int | None = Field(default=None, ge=16)
    """Longest sample trained; longer ones are an error (set explorer limits instead)."""


class TorchTrainerConfig(TrainerSettings):
    """The embedded trainer: plain PyTorch on CPU or one GPU."""

    type: Literal["torch"] = "torch"
    device: str = "auto"
    """`auto` (CUDA if available), `cpu`, `cuda` or `cuda:N`."""
    share_prefix: bool = True
    """Run the token prefix that every sample of a mini-batch shares (system prompt, tool schemas,
    few-shot turns) through the model once, not once per sample. Exact: gradients flow through
    it. Off with `gradient_checkpointing`, for models with sliding-window layers, and when the
    shared prefix is shorter than 32 tokens."""
    share_group_prefix: bool = True
    """With `share_prefix`, also run the prompt that only some samples share past it (a GRPO
    group's task and first observation) once per micro-batch: micro-batches are packed family by
    family (samples sharing at least 32 more tokens), each running that prompt once for all its
    rows. Exact like `share_prefix`; it trades larger passes for fewer tokens, which pays on CPU
    and when prompts are long against completions (docs/benchmarks.md)."""
    optimizer_state_dtype: Literal["float32", "bfloat16"] = "float32"
    """AdamW's two moments: fp32 (torch's AdamW), or bf16 with stochastic rounding
    (`trainers/optim.py`): 4 bytes a trained parameter instead of 8 (-0.54 GB for SmolLM2-135M),
    weights and the update's arithmetic still fp32. Checkpoints keep the dtype."""
    memory_budget_gib: float | None = Field(default=None, gt=0)
    """Memory the trainer may use (GiB; CPU RAM, or the GPU's memory on CUDA): fixed weights,
    gradients and AdamW state, plus one pass's activations and log-probs. Each step splits its
    micro-batches below `micro_batch_tokens` as needed to stay within it; where the prompt all
    samples share (`share_prefix`) would hold its activations across the passes, it is run again
    for its backward instead when that fits more tokens per pass; when one sample would not fit
    otherwise it first recomputes the log-probs in backward instead of keeping them, then turns
    on gradient checkpointing, for that step only (all logged). A budget below the fixed part is
    an error naming it. null: no budget (`micro_batch_tokens` as given)."""
    memory_budget_measured: bool = True
    """With `memory_budget_gib`: measure each step (resident memory on CPU, allocated on CUDA; a
    step that creates AdamW's state, the first, up to that point: its passes) and hold back from
    the budget the most a step exceeded its plan by (the allocator's cached blocks, temporaries
    the estimate leaves out; metrics `train/memory_step_gib`, `train/memory_overshoot_gib`), as
    far as passes without gradient checkpointing allow (checkpointing only where the estimate
    needs it; a partial hold-back is warned once). Off: plans follow the estimate only
    (`run.deterministic` turns it off: measured memory varies from run to run, and micro-batch
    sizes change sums)."""


class VerlRayConfig(Section):
    """Ray for a verl trainer with more than one rank (one Ray actor per rank)."""

    address: str | None = None
    """Ray cluster to join (`auto`, `ray://head:10001`, `head:6379`); null: join the cluster this
    process already belongs to, else start a local Ray (stopped again by `close()`)."""
    num_cpus: int | None = Field(default=None, ge=1)
    """CPUs of an auto-started local Ray (null: Ray counts them). On `device: cpu` every rank
    takes one."""


class VerlTrainerConfig(TrainerSettings):
    """verl's FSDP training engine (verl==0.9.1): multi-GPU and multi-node, same algorithms.

    Example:
        >>> cfg = VerlTrainerConfig(n_gpus_per_node=4, micro_batch_size=2, lr=1e-6)
        >>> cfg.strategy, cfg.world_size
        ('fsdp2', 4)
    """

    type: Literal["verl"] = "verl"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto`: CUDA if visible, else CPU (gloo; fsdp2 only: for tests and small models)."""
    n_gpus_per_node: int = Field(default=1, ge=1)
    """Trainer ranks per node: GPUs (one rank each), or processes on `device: cpu`. More than one
    rank in total runs the ranks as Ray actors; one rank runs in the trainer's process."""
    nnodes: int = Field(default=1, ge=1)
    """Nodes the trainer spans (Ray places `n_gpus_per_node` ranks on each)."""
    strategy: Literal["fsdp2", "fsdp"] = "fsdp2"
    """FSDP2 (`fully_shard`, default) or FSDP1 (`fsdp`, CUDA only)."""
    fsdp_size: int = Field(default=-1)
    """Ranks a parameter is sharded over (-1: all ranks; e.g. `n_gpus_per_node` gives hybrid
    sharding: shard within a node, replicate across nodes)."""
    micro_batch_size: int | None = Field(default=None, ge=1)
    """Rows per forward/backward on each rank; null: pack rows up to `micro_batch_tokens` real
    tokens per rank (verl's dynamic batching)."""
    param_offload: bool = False
    """Keep parameters in CPU memory outside the training step (a GPU shared with vLLM)."""
    optimizer_offload: bool = False
    """Keep AdamW state in CPU memory outside the training step."""
    batch_padding: Literal["pad", "trim"] = "pad"
    """A mini-batch that does not split into ranks x micro_batch_size: `pad` adds fully-masked
    rows (no loss, no gradient), `trim` drops trailing samples. Both are logged."""
    remove_padding: bool = True
    """Pack each micro-batch into one sequence without padding (verl's `use_remove_padding`)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """The HF attention implementation; `flash_attention_2` needs CUDA and the `flash-attn`
    package (checked before anything starts)."""
    ray: VerlRayConfig = Field(default_factory=VerlRayConfig)

    @field_validator("fsdp_size")
    @classmethod
    def _fsdp_size(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError(f"fsdp_size must be -1 (all ranks) or >= 1, got {value}")
        return value

    @property
    def world_size(self) -> int:
        """Trainer ranks in total."""
        return self.n_gpus_per_node * self.nnodes


TrainerConfig = Annotated[TorchTrainerConfig | VerlTrainerConfig, Field(discriminator="type")]
