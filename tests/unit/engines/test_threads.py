"""The engine's thread policy (measures both thread counts per forward size, uses the faster,
keeps re-measuring, follows a change in which is faster) and the helpers that keep the engine's
OpenMP team the only one that lasts."""

import contextvars
import itertools
import os
import sys
import threading
import time

import pytest
import torch

from agentscope_rft.engines.threads import ThreadPolicy, confine_main_thread, in_own_thread

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts OS threads in /proc"
)


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


def test_a_retry_that_keeps_losing_waits_longer_and_one_that_wins_is_taken_up():
    policy = ThreadPolicy(low=1, high=2, retry_every=4, max_retry_every=64)
    picks = run(policy, 200, {1: 0.600, 2: 0.350}, 400)[2:]
    retries = [i for i, threads in enumerate(picks) if threads == 1]
    gaps = [b - a for a, b in itertools.pairwise(retries)]
    assert gaps[:4] == [8, 16, 32, 64] and set(gaps[4:]) == {64}  # doubling up to the cap
    assert len(retries) <= 9  # a fixed interval of 4 would have cost 100 slow prefills
    # The core comes back (say another process ended): one thread is now the faster.
    later = run(policy, 200, {1: 0.200, 2: 0.350}, 160)
    switched = later.index(1) + 1
    assert later[switched + 16 :].count(1) >= len(later[switched + 16 :]) - 8


def native_threads() -> int:
    """OS threads of this process that Python did not start (OpenMP's, BLAS's)."""
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())


@linux_only
async def test_work_in_its_own_thread_ends_with_its_openmp_team():
    def work() -> threading.Thread:
        torch.set_num_threads(2)
        torch.ones(1 << 22).add_(1.0)  # big enough to run on a team of 2
        return threading.current_thread()

    warm = threading.Thread(target=work)  # torch starts a helper thread once per process
    warm.start()
    warm.join()
    time.sleep(0.2)
    before = native_threads()
    thread = await in_own_thread(work)
    thread.join(timeout=10)
    assert not thread.is_alive() and thread is not threading.current_thread()
    deadline = time.monotonic() + 10  # the team's workers exit after the thread itself
    while native_threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert native_threads() <= before  # a pool thread (asyncio.to_thread) would keep its team


async def test_own_thread_results_errors_and_context_vars():
    var = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    assert await in_own_thread(lambda a, b=0: (a + b, var.get()), 1, b=2) == (3, "caller's")

    def fail() -> None:
        raise KeyError("from the thread")

    with pytest.raises(KeyError, match="from the thread"):
        await in_own_thread(fail)


def test_confining_the_main_thread_and_nothing_else():
    restore = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen = []
        worker = threading.Thread(target=lambda: (confine_main_thread(), seen.append(1)))
        worker.start()
        worker.join()
        assert seen and torch.get_num_threads() == 2  # not the main thread: nothing changed
        confine_main_thread()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(restore)


def test_times_that_grow_with_the_context_do_not_flip_the_choice():
    # Decode steps get slower as the context grows; two threads stay 1.3x faster throughout.
    # Comparing the best count's fresh times with the other's old ones would flip to one.
    policy = ThreadPolicy(low=1, high=2, retry_every=8)
    picks = []
    for step in range(400):
        threads = policy.choose(1)
        base = 0.020 * (1 + step / 100)
        policy.record(1, threads, base * (1.3 if threads == 1 else 1.0))
        picks.append(threads)
    assert picks[2:].count(1) <= 8  # retries only, backing off


def test_a_sudden_slowdown_is_checked_at_once():
    policy = ThreadPolicy(low=1, high=2, retry_every=4, max_retry_every=512)
    run(policy, 1, {1: 0.030, 2: 0.020}, 200)  # retries backed off to long waits
    later = run(policy, 1, {1: 0.030, 2: 0.060}, 6)  # a core was taken: 2 threads now slower
    assert later[:3] == [2, 1, 1]  # the slow step triggers a retry, which wins
