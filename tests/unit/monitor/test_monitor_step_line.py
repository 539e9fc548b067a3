"""The one-line step summary."""

from __future__ import annotations

import math

from agentscope_rft.monitor import DEFAULT_CONSOLE_METRICS, format_step_line

FULL_STEP = {
    "reward/mean": 0.41,
    "reward/std": 0.333,
    "reward/min": 0.0,
    "reward/max": 1.0,
    "success_rate": 0.4375,
    "response_length/mean": 37.2,
    "kl/mean": 0.00213,
    "entropy/mean": 1.214,
    "grad_norm": 0.8,
    "tokens_per_s": 310.4,
    "time/explore": 21.34,
    "time/train": 9.8,
    "time/sync": 0.42,
    "time/step": 31.6,
    "loss": 0.0123,
    "lr": 1e-6,
    "policy_version": 12,
    "explore/failed": 0,
    "my_custom_metric": 5.0,
}


def test_full_step_line() -> None:
    assert format_step_line(12, FULL_STEP) == (
        "step 12 | reward 0.41±0.33 | success 44% | len 37 | kl 0.0021 | ent 1.21 | gnorm 0.8"
        " | 310 tok/s | explore 21.3s train 9.8s sync 0.4s"
    )


def test_missing_metrics_are_left_out() -> None:
    line = format_step_line(3, {"reward/mean": 0.5, "time/train": 2.0, "grad_norm": 12.5})
    assert line == "step 3 | reward 0.50 | gnorm 12.5 | train 2.0s"


def test_only_the_step_when_nothing_known_is_logged() -> None:
    assert format_step_line(7, {"my_custom_metric": 1.0}) == "step 7"


def test_failed_episodes_show_only_when_there_are_some() -> None:
    assert "failed" not in format_step_line(1, {"explore/failed": 0})
    assert format_step_line(1, {"explore/failed": 3}) == "step 1 | failed 3"


def test_eval_lines_are_marked() -> None:
    line = format_step_line(20, {"reward/mean": 0.52, "success_rate": 0.55}, phase="eval")
    assert line == "[eval] step 20 | reward 0.52 | success 55%"


def test_custom_keys_choose_order_and_format_unknown_names() -> None:
    keys = ["policy_version", "loss", "lr", "my_custom_metric", "time/step", "reward/max"]
    assert format_step_line(12, FULL_STEP, keys=keys) == (
        "step 12 | version 12 | loss 0.0123 | lr 1e-06 | my_custom_metric 5 | total 31.6s"
        " | max 1.00"
    )


def test_number_formats_at_other_scales() -> None:
    line = format_step_line(
        1,
        {"reward/mean": -12.25, "reward/std": 0.004, "tokens_per_s": 12345.6, "kl/mean": math.nan},
    )
    assert line == "step 1 | reward -12.25±0.004 | kl nan | 12346 tok/s"


def test_default_keys_are_the_documented_names() -> None:
    assert DEFAULT_CONSOLE_METRICS[0] == "reward/mean"
    assert {"success_rate", "tokens_per_s", "time/explore", "time/sync"} <= set(
        DEFAULT_CONSOLE_METRICS
    )
