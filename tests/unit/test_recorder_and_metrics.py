"""The gateway recorder's bounds (age, count, memory; idle rollouts first) and /metrics' formats."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentscope_rft.gateway.metrics import Histogram, gateway_metrics, prometheus_text
from agentscope_rft.gateway.recorder import CallRecorder, call_bytes
from agentscope_rft.types import Call


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_call(rollout_id: str, prompt_tokens: int = 10, text: str = "hi") -> Call:
    return Call(
        call_id=f"{rollout_id}-c",
        request_id="q",
        rollout_id=rollout_id,
        agent_name=None,
        messages=[{"role": "user", "content": text}],
        tools=None,
        prompt_ids=list(range(1000, 1000 + prompt_tokens)),
        completion_ids=[5, 6],
        logprobs=[-0.5, -0.25],
        finish_reason="stop",
        policy_version=0,
    )


def record(recorder: CallRecorder, rollout_id: str, **kwargs) -> None:
    recorder.begin(rollout_id)
    recorder.end(rollout_id, [make_call(rollout_id, **kwargs)])


def test_call_bytes_grows_with_tokens_and_text():
    small, long_prompt = make_call("r", 10), make_call("r", 1010)
    assert call_bytes(long_prompt) - call_bytes(small) == 36 * 1000
    assert call_bytes(make_call("r", text="x" * 1002)) - call_bytes(small) == 2 * 1000


def test_idle_rollouts_older_than_max_age_are_evicted():
    clock = Clock()
    recorder = CallRecorder(max_age=60, clock=clock)
    record(recorder, "old")
    clock.now = 30
    record(recorder, "young")
    clock.now = 61  # "old" has been idle 61 s, "young" 31 s
    record(recorder, "new")
    assert recorder.calls("old") == [] and len(recorder.calls("young")) == 1
    assert recorder.evictions == {"age": 1} and recorder.evicted_calls == 1


def test_count_bound_evicts_the_least_recently_active_idle_rollout():
    recorder = CallRecorder(max_rollouts=2, clock=Clock())
    record(recorder, "a")
    record(recorder, "b")
    recorder.begin("a")  # "a" is active again and has a request in flight
    record(recorder, "c")
    assert recorder.rollout_ids == ["a", "c"] and recorder.evictions == {"count": 1}
    recorder.end("a", [])
    assert recorder.in_flight("a") == 0


def test_a_rollout_with_a_request_in_flight_is_never_evicted():
    clock = Clock()
    recorder = CallRecorder(max_rollouts=1, max_age=10, clock=clock)
    record(recorder, "busy")
    recorder.begin("busy")
    clock.now = 100
    record(recorder, "other")  # over the count and "busy" is old, but it is generating
    assert len(recorder.calls("busy")) == 1
    recorder.end("busy", [make_call("busy")])
    assert len(recorder.calls("busy")) == 2


def test_memory_bound_evicts_until_under_it_and_accounts_bytes():
    one = call_bytes(make_call("x", 100))
    recorder = CallRecorder(max_bytes=3 * one, clock=Clock())
    for i in range(5):
        record(recorder, f"r{i}", prompt_tokens=100)
    assert recorder.rollout_ids == ["r2", "r3", "r4"]
    assert recorder.held_bytes == 3 * one
    assert recorder.evictions == {"bytes": 2} and recorder.evicted_calls == 2
    stats = recorder.stats()
    assert stats["recorder_bytes"] == 3 * one and stats["recorder_evictions_bytes"] == 2


async def test_take_and_discard_release_their_memory():
    recorder = CallRecorder(clock=Clock())
    record(recorder, "a")
    record(recorder, "b")
    assert len(await recorder.take("a")) == 1
    recorder.discard("b")
    assert recorder.held_bytes == 0 and recorder.rollout_ids == []
    assert recorder.stats()["recorder_rollouts"] == 0
    assert recorder.started("a") == 1  # call numbers (seeds) survive a take


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="positive"):
        CallRecorder(max_bytes=0)


def test_histogram_buckets_and_quantiles():
    hist = Histogram(bounds=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0):
        hist.observe(value)
    assert hist.counts == [2, 1, 1] and hist.count == 4 and hist.total == pytest.approx(2.65)
    assert hist.quantile(0.5) == 0.1 and hist.quantile(0.75) == 1.0
    assert hist.quantile(1.0) == math.inf


def test_prometheus_text_parses_with_the_reference_parser():
    hist = Histogram()
    for value in (0.02, 0.3, 7.0):
        hist.observe(value)
    recorder = CallRecorder(max_rollouts=1, clock=Clock())
    record(recorder, "a")
    record(recorder, "b")
    metrics = gateway_metrics(
        {"requests_ok": 5, "requests_failed": 1, "prompt_tokens": 120, "completion_tokens": 40},
        recorder.stats(),
        {"in_flight": 2.0, "last_sync.seconds": 0.5},
        policy_version=3,
        recorded_calls=recorder.total_calls,
    )
    text = prometheus_text(metrics, hist)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values()
               for s in f.samples}  # fmt: skip
    assert samples[("agentscope_rft_gateway_requests_total", (("outcome", "ok"),))] == 5
    assert samples[("agentscope_rft_gateway_requests_total", (("outcome", "failed"),))] == 1
    assert samples[("agentscope_rft_gateway_completion_tokens_total", ())] == 40
    assert samples[("agentscope_rft_policy_version", ())] == 3
    assert samples[("agentscope_rft_recorder_evictions_total", (("reason", "count"),))] == 1
    assert samples[("agentscope_rft_engine_last_sync_seconds", ())] == 0.5
    assert families["agentscope_rft_gateway_request_seconds"].type == "histogram"
    assert samples[("agentscope_rft_gateway_request_seconds_bucket", (("le", "0.5"),))] == 2
    assert samples[("agentscope_rft_gateway_request_seconds_bucket", (("le", "+Inf"),))] == 3
    assert samples[("agentscope_rft_gateway_request_seconds_count", ())] == 3
    assert families["agentscope_rft_gateway_requests"].type == "counter"
