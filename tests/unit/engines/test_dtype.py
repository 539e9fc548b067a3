"""`dtype: auto` on CPU: bf16 only where the CPU computes it natively and it is faster."""

import types

import pytest
import torch

from agentscope_rft.engines import cpu_dtype
from agentscope_rft.engines.cpu_dtype import bf16_speedup, cpu_has_native_bf16, pick_dtype


def fake_cpu(monkeypatch: pytest.MonkeyPatch, machine: str, bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(cpu_dtype.platform, "machine", lambda: machine)
    probes = types.SimpleNamespace(
        _is_avx512_bf16_supported=lambda: bf16, _is_amx_tile_supported=lambda: amx
    )
    monkeypatch.setattr(torch, "cpu", probes)


def test_an_x86_cpu_without_bf16_instructions_computes_in_fp32_without_timing(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", bf16=False, amx=False)
    monkeypatch.setattr(cpu_dtype.time, "perf_counter", lambda: pytest.fail("timed a near tie"))
    assert not cpu_has_native_bf16()
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # asked for: kept


@pytest.mark.parametrize(
    ("machine", "bf16", "amx"),
    [("x86_64", True, False), ("x86_64", False, True), ("aarch64", False, False)],
)
def test_native_bf16_or_another_architecture_is_timed(monkeypatch, machine, bf16, amx):
    fake_cpu(monkeypatch, machine, bf16=bf16, amx=amx)
    assert cpu_has_native_bf16()
    assert pick_dtype("auto", torch.device("cpu")) in (torch.float32, torch.bfloat16)


def test_the_speedup_is_measured_once_per_machine(monkeypatch, tmp_path):
    """One timing flipped between runs on a loaded machine (0.30x and 36.9x measured): the
    engine and trainer of a run, and a resumed run, must not each decide for themselves."""
    cache = tmp_path / "cpu_bf16_speedup.json"
    speedup, kept_in = bf16_speedup(cache)
    assert kept_in == cache and speedup > 0
    monkeypatch.setattr(cpu_dtype.time, "perf_counter", lambda: pytest.fail("timed again"))
    assert bf16_speedup(cache) == (speedup, cache)
    cache.write_text('{"key": "another CPU", "speedup": 9.0}')  # another machine's: measured
    monkeypatch.undo()
    assert bf16_speedup(cache)[0] != 9.0


def test_auto_follows_the_kept_speedup(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, "aarch64", bf16=False, amx=False)
    for kept, want in ((0.3, torch.float32), (2.0, torch.bfloat16)):
        monkeypatch.setattr(cpu_dtype, "bf16_speedup", lambda kept=kept: (kept, tmp_path / "k"))
        assert pick_dtype("auto", torch.device("cpu")) == want
