"""`agentscope-rft dashboard` as a user starts it: the port it listens on, or why it cannot."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

CLI = [sys.executable, "-m", "agentscope_rft.cli", "dashboard"]
ENV = {**os.environ, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}


def test_a_port_in_use_is_one_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*CLI, str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=ENV,
        )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "pick another --port" in proc.stderr
    assert "dashboard of" not in proc.stdout  # no URL of a dashboard that is not there


def test_port_0_shows_the_port_it_picked(tmp_path):
    proc = subprocess.Popen(
        [*CLI, str(tmp_path), "--port", "0"], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(": ", 1)[1].strip()
        assert ":0/" not in url, line
        for _ in range(100):  # the URL is printed just before the server starts listening
            try:
                response = httpx.get(url.split("?")[0] + "api/runs", timeout=10)
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        assert response.json()["runs"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
