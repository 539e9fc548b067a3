"""The engine's thread policy: measures both thread counts per forward size, uses the faster,
keeps re-measuring, and follows a change in which is faster."""

import pytest

from agentscope_rft.engines.threads import ThreadPolicy


def run(policy, tokens, seconds_for, steps):
    picks = []
    for _ in range(steps):
        threads = policy.choose(tokens)
        policy.record(tokens, threads, seconds_for[threads])
        picks.append(threads)
    return picks


def test_it_picks_the_faster_per_size_and_retries_the_other():
    policy = ThreadPolicy(low=1, high=2, retry_every=8)
    small = run(policy, 3, {1: 0.030, 2: 0.040}, 32)  # small steps: one thread is faster
    large = run(policy, 200, {1: 0.600, 2: 0.350}, 32)  # large: all cores are faster
    assert small[:2] == [1, 2] and large[:2] == [1, 2]  # both measured first
    assert small[2:].count(1) > 24 and large[2:].count(2) > 24
    assert 2 in small[2:] and 1 in large[2:]  # the slower is retried now and then
    assert policy.summary() == {"threads/tokens_2_3": 1.0, "threads/tokens_128_255": 2.0}


def test_it_follows_the_machine_when_the_faster_changes():
    policy = ThreadPolicy(low=1, high=2, retry_every=4)
    run(policy, 40, {1: 0.10, 2: 0.06}, 20)
    assert policy.choose(40) == 2
    # Another process takes a core: two threads now wait at every barrier.
    later = run(policy, 40, {1: 0.10, 2: 0.50}, 40)
    assert later[-12:].count(1) >= 9


def test_fixed_thread_counts_and_bad_ranges():
    fixed = ThreadPolicy(3, 3)
    assert fixed.fixed and {fixed.choose(n) for n in (1, 50, 5000)} == {3}
    fixed.record(50, 3, 1.0)
    assert fixed.summary() == {}
    with pytest.raises(ValueError, match="1 <= low <= high"):
        ThreadPolicy(2, 1)
    with pytest.raises(ValueError, match="1 <= low <= high"):
        ThreadPolicy(0, 2)
