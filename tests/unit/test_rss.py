"""`PhasePeaks`: the peak resident memory of each phase of a step."""

from __future__ import annotations

import time

from agentscope_rft.rss import GIB, PhasePeaks, phase_metric, rss_reader


def test_each_take_is_the_peak_since_the_one_before() -> None:
    values = iter([1, 5, 2, 2, 7, 3, 3])
    peaks = PhasePeaks(read=lambda: next(values) * GIB)
    peaks._sample()  # 1
    peaks._sample()  # 5: a phase's peak, gone by its end
    assert peaks.take() == 5  # (sampled at the end too: 2)
    peaks._sample()  # 2
    assert peaks.take() == 7  # the end of a phase counts even when no sample fell inside it
    assert peaks.take() == 7  # a phase starts from what was resident when the one before ended
    assert peaks.take() == 3


def test_peek_reads_the_phase_peak_without_ending_the_phase() -> None:
    values = iter([1, 6, 2, 3, 2])
    peaks = PhasePeaks(read=lambda: next(values) * GIB)
    peaks._sample()  # 1
    peaks._sample()  # 6
    assert peaks.peek() == 6  # (sampled: 2)
    assert peaks.peek() == 6  # (sampled: 3) the same phase
    assert peaks.take() == 6  # and take() still ends it


def test_the_thread_sees_a_peak_freed_before_the_phase_ends() -> None:
    if rss_reader() is None:
        return  # no way to read RSS on this platform: PhasePeaks records nothing
    with PhasePeaks(interval=0.005) as peaks:
        base = peaks.take()
        block = bytearray(256 * 2**20)  # touched: resident
        time.sleep(0.1)
        del block
        time.sleep(0.05)
        peak = peaks.take()
        after = peaks.now()
    assert base is not None and peak is not None and after is not None
    assert peak >= base + 0.2  # the 256 MiB held for 0.1 s
    assert phase_metric("eval") == "memory/eval_peak_gib"


def test_without_a_way_to_read_rss_nothing_is_recorded() -> None:
    peaks = PhasePeaks(read=None)
    peaks._read = None
    with peaks:
        assert peaks.take() is None and peaks.now() is None and not peaks.available
