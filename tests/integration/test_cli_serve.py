"""`agentscope-rft serve` as a user runs it: a subprocess that answers the openai client."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, port: int) -> None:
    """Until `serve` answers /health (at most 120 s), failing with its output if it exits."""
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""


def test_serve_answers_openai_client_and_stops_cleanly(tiny_model_path):
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentscope_rft.cli",
            "serve",
            "--model",
            tiny_model_path,
            "--port",
            str(port),
            "--api-key",
            "k1",
            "--dtype",
            "float32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait_healthy(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k1")
        model = client.models.list().data[0].id
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert r.choices[0].message.role == "assistant"
        assert r.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "serving" in out


def test_serve_unknown_model_is_a_clear_error():
    proc = subprocess.run(
        [sys.executable, "-m", "agentscope_rft.cli", "serve", "--model", "no-such-model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown model 'no-such-model'" in proc.stderr


def test_serve_on_a_port_in_use_is_a_clear_error(tiny_model_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--model", tiny_model_path, "--port", str(port), "--dtype", "float32"]
        proc = subprocess.run(
            [sys.executable, "-m", "agentscope_rft.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "1000"},
        )
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "pick another --port" in proc.stderr and "Traceback" not in proc.stderr


def test_a_served_checkpoint_answers_to_the_name_it_was_served_by(tiny_model_path, tmp_path):
    run = tmp_path / "runs" / "r1"
    step = run / "checkpoints" / "step-000002"
    shutil.copytree(tiny_model_path, step / "model")
    (step / "run_state.json").write_text("{}")  # written last: the checkpoint is complete
    port = _free_port()
    spec = f"{run}:last"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentscope_rft.cli", "serve", "--model", spec,
         "--port", str(port), "--dtype", "float32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        _wait_healthy(proc, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        listed = client.models.list().data[0].id
        assert listed.endswith("step-000002/model")
        for name in (spec, listed):  # as the user named it, and as resolved
            reply = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert reply.usage.completion_tokens >= 1
        try:
            client.chat.completions.create(
                model=f"{run}:best", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            raise AssertionError("a model it does not serve was answered")
        except openai.NotFoundError:
            pass
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
