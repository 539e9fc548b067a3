"""Stop requests, process clean-up and the per-call token cap (no model needed)."""

import asyncio
import subprocess
import sys
import time

import pytest

from agentscope_rft.gateway.protocol import parse_request
from agentscope_rft.runtime.signals import RunStop, Stopping


async def test_until_returns_the_result_when_no_stop_comes():
    stop = RunStop()
    assert await stop.until(asyncio.sleep(0.01, result=7)) == 7


async def test_until_cancels_the_awaitable_when_a_stop_comes():
    stop = RunStop()
    cancelled = asyncio.Event()

    async def long_job() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.05, stop.request, "SIGTERM")
    started = time.perf_counter()
    with pytest.raises(Stopping):
        await stop.until(long_job())
    assert time.perf_counter() - started < 5
    assert cancelled.is_set() and stop.reason == "SIGTERM"
    with pytest.raises(Stopping):  # once stopped, every later wait stops at once
        await stop.until(asyncio.sleep(60))


async def test_first_reason_is_kept():
    stop = RunStop()
    stop.request("SIGINT")
    stop.request("SIGTERM")
    await asyncio.wait_for(stop.wait(), 1)
    assert stop.reason == "SIGINT"


KILLER = """
import subprocess, sys, time
from agentscope_rft.runtime.processes import descendants, kill_descendants
script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
while len(descendants()) < 2:  # the child and its `sleep`
    time.sleep(0.05)
found = descendants()
killed = kill_descendants(grace=2.0)
print(sorted(found) == sorted(killed), child.pid in killed, child.poll() is not None, descendants())
"""


def test_kill_descendants_ends_children_and_grandchildren():
    # In a process of its own: here it would also end other tests' helper processes.
    out = subprocess.run([sys.executable, "-c", KILLER], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True True True []", out.stdout + out.stderr


SPARING = """
import subprocess, sys, time
from agentscope_rft.runtime.processes import alive, descendants, kill_descendants
script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
before = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
while len(descendants()) < 2:
    time.sleep(0.05)
spared = frozenset(descendants())  # what ran before the command: not the run's
run_child = subprocess.Popen(["sleep", "60"])
killed = kill_descendants(grace=2.0, spare=spared)
print(killed == [run_child.pid], all(alive(p) for p in spared), run_child.poll() is not None)
kill_descendants(grace=0)
"""


def test_kill_descendants_spares_what_ran_before_the_command():
    # The CLI's commands spare the processes their caller already had (a notebook, a test).
    out = subprocess.run(
        [sys.executable, "-c", SPARING], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True True True", out.stdout + out.stderr


def test_token_cap_applies_when_the_request_sets_none_or_more():
    body = parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert body.sampling(overrides={"max_tokens_limit": 64}).max_tokens == 64
    assert body.sampling().max_tokens is None
    asked = parse_request(
        b'{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}'
    )
    assert asked.sampling(overrides={"max_tokens_limit": 64}).max_tokens == 10
    forced = {"max_tokens": 500, "max_tokens_limit": 64}
    assert asked.sampling(overrides=forced).max_tokens == 64
