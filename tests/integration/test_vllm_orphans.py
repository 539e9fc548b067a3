"""A run killed with SIGKILL leaves no vLLM server behind (its KV cache held memory for good).

Needs no vLLM: the managed command is a stand-in that, like vLLM's API server, has children of
its own (vLLM's engine core and workers) in its process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

# The run: a VLLMServer as the engine builds it, its process started, then the run waits.
RUN = """
import sys, time
from pathlib import Path
from agentscope_rft.engines.vllm_server import VLLMServer
server = VLLMServer("replica-0", url="http://127.0.0.1:9", command=sys.argv[1:],
                    log_path=Path(sys.argv[2]).with_suffix(".log"))
print(server.process.start("starting replica-0"), flush=True)
time.sleep(600)
"""
# The server: a child of its own ("engine core"), then both wait.
SERVER = "import subprocess, sys, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def test_the_server_group_ends_with_a_killed_run(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    run = subprocess.Popen(
        [sys.executable, "-c", RUN, sys.executable, str(script)], stdout=subprocess.PIPE, text=True
    )
    assert run.stdout is not None
    server_pid = int(run.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while len(_group(server_pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the server and its child are up
        assert len(_group(server_pid)) == 2
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _group(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _group(server_pid) == []
    finally:
        run.kill()
        for proc in _group(server_pid):
            proc.kill()
