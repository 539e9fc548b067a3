"""Progress bars: live on a terminal, a rate-limited plain line elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from agentscope_rft.monitor import ProgressHandle


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120), out


def test_non_terminal_prints_a_heartbeat_not_frames() -> None:
    console, out = _console(terminal=False)
    clock = FakeClock()
    with ProgressHandle(console, interval_s=30.0, clock=clock) as progress:
        assert not progress.live
        progress.reset("run", total=10, completed=4)
        progress.reset("explore", total=64)
        for _ in range(40):  # 40 episodes in 20 s: no line yet
            clock.now += 0.5
            progress.advance("explore")
        assert out.getvalue() == ""
        clock.now += 11.0
        progress.advance("explore")
        progress.advance("explore")  # right after a line: rate-limited
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("progress | steps 4/10 | exploring 41/64 (")
    assert "rollouts/s)" in lines[0]
    assert progress.completed("explore") == 42


def test_non_terminal_with_interval_zero_is_silent() -> None:
    console, out = _console(terminal=False)
    clock = FakeClock()
    with ProgressHandle(console, interval_s=0.0, clock=clock) as progress:
        progress.reset("train", total=8)
        clock.now += 1000
        progress.advance("train", 8)
    assert out.getvalue() == ""
    assert progress.completed("train") == 8


def test_terminal_draws_the_bars() -> None:
    console, out = _console(terminal=True)
    with ProgressHandle(console) as progress:
        assert progress.live
        progress.reset("run", total=3)
        progress.reset("explore", total=16)
        progress.advance("explore", 16)
        progress.reset("train", total=4)
        progress.advance("train", 2)
        console.print("step 1 | reward 0.50", highlight=False)  # scrolls above the bars
    text = out.getvalue()
    for expected in ("steps", "0/3", "exploring", "16/16", "training", "2/4", "step 1 | reward"):
        assert expected in text


def test_disabled_shows_nothing() -> None:
    console, out = _console(terminal=True)
    with ProgressHandle(console, enabled=False) as progress:
        progress.reset("run", total=3)
        progress.advance("run")
    assert out.getvalue() == ""
    assert progress.completed("run") == 1


def test_unknown_total() -> None:
    console, _ = _console(terminal=False)
    progress = ProgressHandle(console)
    progress.reset("explore", total=None)
    progress.advance("explore", 5)
    assert progress.plain_line() == "progress | exploring 5/?"
