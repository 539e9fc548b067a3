"""`dtype: auto` on CPU: bf16 only where the CPU computes it natively and it is faster."""

import types

import pytest
import torch

from agentscope_rft.engines import embedded
from agentscope_rft.engines.embedded import cpu_has_native_bf16, pick_dtype


def fake_cpu(monkeypatch: pytest.MonkeyPatch, machine: str, bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(embedded.platform, "machine", lambda: machine)
    probes = types.SimpleNamespace(
        _is_avx512_bf16_supported=lambda: bf16, _is_amx_tile_supported=lambda: amx
    )
    monkeypatch.setattr(torch, "cpu", probes)


def test_an_x86_cpu_without_bf16_instructions_computes_in_fp32_without_timing(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", bf16=False, amx=False)
    monkeypatch.setattr(embedded.time, "perf_counter", lambda: pytest.fail("timed a near tie"))
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
