"""The gateway's `/metrics`: Prometheus text format for scrapers, JSON for humans.

`GET /metrics` answers in the Prometheus text exposition format (version 0.0.4, as vLLM and other
inference servers do), every name prefixed `agentscope_rft_`; `GET /metrics?format=json` gives
the same numbers as one JSON object.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: `le` upper bounds, plus +Inf)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile `q` (None when empty)."""
        if not self.count:
            return None
        rank, seen = q * self.count, 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            seen += n
            if seen >= rank:
                return bound
        return math.inf


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # counter | gauge
    help: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    escaped = (
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels.items()
    )
    return "{" + ",".join(escaped) + "}"


def prometheus_text(metrics: list[Metric], latency: Histogram) -> str:
    """The exposition text: HELP/TYPE once per name, then its samples; the latency histogram."""
    lines: list[str] = []
    described: set[str] = set()
    for metric in metrics:
        name = f"agentscope_rft_{metric.name}"
        if name not in described:
            described.add(name)
            lines += [f"# HELP {name} {metric.help}", f"# TYPE {name} {metric.kind}"]
        lines.append(f"{name}{_labels(metric.labels)} {_number(metric.value)}")
    name = "agentscope_rft_gateway_request_seconds"
    lines += [
        f"# HELP {name} Seconds from a chat request's arrival to its last byte.",
        f"# TYPE {name} histogram",
    ]
    cumulative = 0
    for bound, n in zip((*latency.bounds, math.inf), latency.counts, strict=True):
        cumulative += n
        lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {cumulative}')
    lines += [f"{name}_sum {_number(latency.total)}", f"{name}_count {latency.count}"]
    return "\n".join(lines) + "\n"


def gateway_metrics(
    counters: Mapping[str, int],
    recorder: Mapping[str, float],
    engine: Mapping[str, float],
    policy_version: int,
    recorded_calls: int,
) -> list[Metric]:
    """The gateway's numbers as Prometheus metrics (the engine's own numbers as gauges)."""
    metrics = [
        Metric("gateway_requests_total", "counter", "Chat requests answered, by outcome.",
               counters.get("requests_ok", 0), {"outcome": "ok"}),
        Metric("gateway_requests_total", "counter", "Chat requests answered, by outcome.",
               counters.get("requests_failed", 0), {"outcome": "failed"}),
        Metric("gateway_prompt_tokens_total", "counter", "Prompt tokens of answered requests.",
               counters.get("prompt_tokens", 0)),
        Metric("gateway_completion_tokens_total", "counter", "Tokens generated.",
               counters.get("completion_tokens", 0)),
        Metric("gateway_recorded_calls_total", "counter", "Calls recorded under a rollout.",
               recorded_calls),
        Metric("gateway_tool_choice_forced_total", "counter",
               "Training calls whose forced tool_choice was sampled as auto.",
               counters.get("tool_choice_forced", 0)),
        Metric("gateway_top_logprobs_without_logprobs_total", "counter",
               "Training calls with top_logprobs but not logprobs (served without log-probs).",
               counters.get("top_logprobs_without_logprobs", 0)),
        Metric("gateway_max_tokens_capped_total", "counter",
               "Calls whose max_tokens reached past the context window (cut to fit).",
               counters.get("max_tokens_capped", 0)),
        Metric("policy_version", "gauge", "Version of the weights the engine serves.",
               policy_version),
        Metric("recorder_rollouts", "gauge", "Rollouts the recorder holds.",
               recorder.get("recorder_rollouts", 0.0)),
        Metric("recorder_calls", "gauge", "Calls the recorder holds.",
               recorder.get("recorder_calls", 0.0)),
        Metric("recorder_bytes", "gauge", "Estimated memory of the calls the recorder holds.",
               recorder.get("recorder_bytes", 0.0)),
        Metric("recorder_evicted_calls_total", "counter", "Recorded calls evicted unread.",
               recorder.get("recorder_evicted_calls", 0.0)),
    ]  # fmt: skip
    for key, value in sorted(recorder.items()):
        if key.startswith("recorder_evictions_"):
            reason = key.removeprefix("recorder_evictions_")
            metrics.append(
                Metric("recorder_evictions_total", "counter", "Rollouts evicted, by reason.",
                       value, {"reason": reason})
            )  # fmt: skip
    for key, value in sorted(engine.items()):
        name = "".join(c if c.isalnum() else "_" for c in key)
        metrics.append(Metric(f"engine_{name}", "gauge", f"Engine metric {key}.", value))
    return metrics
