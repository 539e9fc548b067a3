"""Stopping a run: SIGTERM/SIGINT to a real `train` process, then `--resume`; pre-flight checks."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentscope_rft.config import load_config
from agentscope_rft.runtime.components import write_state
from agentscope_rft.runtime.local import train
from agentscope_rft.runtime.signals import EXIT_STOPPED, RunStop, RunStopped

from .test_train_loop import final_weights, toy_config

CLI = [sys.executable, "-m", "agentscope_rft.cli"]


@pytest.fixture(scope="module")
def toy_tasks(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("toy") / "tasks.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(8))
    )
    return path


def train_lines(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("phase") == "train"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is not running
        return handle.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_saves_and_resume_trains_every_step_once(
    tiny_model_path, toy_tasks, tmp_path, signum
):
    run_dir, pid_file = tmp_path / "run", tmp_path / "server.pid"
    args = [
        f"model.name_or_path={tiny_model_path}",
        "workflow=tests/integration/toy_app.py:run_with_server",
        f"tasks.train={toy_tasks}",
        "explorer.group_size=4",
        "explorer.tasks_per_step=2",
        "explorer.sampling.max_tokens=8",
        "engine.dtype=float32",
        "trainer.dtype=float32",
        "run.steps=4",
        f"run.dir={run_dir}",
        "monitor.tensorboard=false",
    ]
    sets = [x for a in args for x in ("--set", a)]
    env = {**os.environ, "TOY_APP_PID_FILE": str(pid_file), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*CLI, "train", *sets], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    deadline = time.time() + 600  # generous: CI machines may be loaded
    while not train_lines(run_dir):  # step 0 trained: step 1 is being explored now
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "no step finished in time"
        time.sleep(0.2)
    proc.send_signal(signum)
    signalled = time.time()
    out, _ = proc.communicate(timeout=180)
    stopping = time.time() - signalled
    assert proc.returncode == EXIT_STOPPED, out
    assert stopping < 60, stopping
    name = signal.Signals(signum).name
    assert f"stopped on {name} after step" in out and "--resume" in out
    state = json.loads((run_dir / "state.json").read_text())
    stopped_at = state["step"]
    assert 1 <= stopped_at < 4, state
    assert (run_dir / "checkpoints" / f"step-{stopped_at:06d}" / "model").is_dir()
    assert len(train_lines(run_dir)) == stopped_at
    server = int(pid_file.read_text())
    assert not alive(server), "the app's helper process outlived the run"

    pid_file.unlink()
    resumed = subprocess.run(
        [*CLI, "train", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    steps = [row["step"] for row in train_lines(run_dir)]
    assert steps == [0, 1, 2, 3]  # every step trained once
    assert final_weights(run_dir, 4)
    assert not alive(int(pid_file.read_text()))  # also a finished run leaves no orphans


async def test_stop_request_then_resume_reaches_the_same_parameters(
    tiny_model_path, toy_tasks, tmp_path
):
    # deterministic: the engine's batching (timing) must not flip a sampled token between runs
    extra = ("run.steps=3", "trainer.lr=1e-2", "trainer.old_logprobs=recompute")
    extra += ("run.deterministic=true",)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    await train(toy_config(tiny_model_path, toy_tasks, straight, *extra), straight)

    stop = RunStop()
    job = asyncio.create_task(
        train(toy_config(tiny_model_path, toy_tasks, stopped, *extra), stopped, stop=stop)
    )
    while not train_lines(stopped):
        assert not job.done(), job.exception()
        await asyncio.sleep(0.05)
    stop.request("test")
    with pytest.raises(RunStopped, match=r"stopped on test after step 1 of 3"):
        await job
    assert json.loads((stopped / "state.json").read_text())["step"] == 1
    await train(load_config(stopped / "config.yaml"), stopped, resume=True)

    a, b = final_weights(straight, 3), final_weights(stopped, 3)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert [r["step"] for r in train_lines(stopped)] == [0, 1, 2]


async def test_a_resume_keeps_the_checkpoint_it_commits_over_a_newer_leftover(
    tiny_model_path, toy_tasks, tmp_path
):
    import shutil

    from agentscope_rft.runtime.components import load_resumed_config

    run_dir = tmp_path / "run"
    small = ("explorer.group_size=2", "explorer.tasks_per_step=2", "run.keep_checkpoints=1")
    config = toy_config(tiny_model_path, toy_tasks, run_dir, *small, "run.steps=1")
    await train(config, run_dir)
    checkpoints = run_dir / "checkpoints"
    # a step-3 checkpoint written in full by an earlier attempt that was killed before it
    # committed it (state.json still names step 1)
    shutil.copytree(checkpoints / "step-000001", checkpoints / "step-000003")
    await train(load_resumed_config(run_dir, ["run.steps=2"]), run_dir, resume=True)
    assert json.loads((run_dir / "state.json").read_text())["step"] == 2
    assert (checkpoints / "step-000002" / "run_state.json").is_file()  # resumable


async def test_resuming_a_finished_run_says_there_is_nothing_left(
    tiny_model_path, toy_tasks, tmp_path
):
    run_dir = tmp_path / "run"
    small = ("explorer.group_size=2", "explorer.tasks_per_step=2", "run.steps=1")
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *small), run_dir)
    metrics = (run_dir / "metrics.jsonl").read_text()
    env = {**os.environ, "COLUMNS": "1000"}
    proc = subprocess.run(
        [*CLI, "train", "--resume", str(run_dir)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing left to train (run.steps: 1, all trained)" in proc.stderr, proc.stderr
    assert f"--resume {run_dir} --set run.steps=<more>" in proc.stderr
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_bad_workflow_path_fails_before_the_engine_starts(toy_tasks, tmp_path):
    proc = subprocess.run(
        [
            *CLI,
            "train",
            "--set",
            "workflow=no/such/app.py:run",
            "--set",
            f"tasks.train={toy_tasks}",
            "--set",
            f"run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},  # what was imported, on stderr
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "no/such/app.py does not exist" in message, message
    assert not (tmp_path / "run").exists()  # nothing was created, nothing loaded
    assert "engine ready" not in proc.stderr
    # The check runs before anything heavy: no engine, trainer, explorer stack or agent framework
    # was imported (what is imported, not how long it took: a timing bound races a busy machine).
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    heavy = {
        *("agentscope", "ray", "agentscope_rft.explorer.explorer"),
        *("agentscope_rft.engines.factory", "agentscope_rft.engines.embedded"),
        *("agentscope_rft.trainers.factory", "agentscope_rft.trainers.torch_trainer"),
    }
    assert not heavy & imported, heavy & imported
    assert "agentscope_rft.runtime.preflight" in imported  # the profile did list imports


def test_bad_offline_data_fails_in_one_line_before_the_run_folder_exists(tiny_model_path, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    run_dir = tmp_path / "run"
    args = [
        *CLI,
        "train",
        *("--set", "run.mode=offline", "--set", "algorithm.objective=sft"),
        *("--set", f"offline.path={data}", "--set", f"model.name_or_path={tiny_model_path}"),
        *("--set", f"run.dir={run_dir}"),
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "sft.jsonl:1: field 'messages' has no assistant turn" in message, message
    assert "Traceback" not in proc.stderr
    # nothing was created: the fixed file then starts the run, not "run folder already exists"
    assert not run_dir.exists()


async def test_preflight_checks_everything_before_any_model_loads(
    tiny_model_path, toy_tasks, tmp_path, monkeypatch
):
    from agentscope_rft.api import WorkflowError
    from agentscope_rft.config import ConfigError
    from agentscope_rft.explorer.tasks import TaskSetError
    from agentscope_rft.models import ModelNotFoundError
    from agentscope_rft.runtime import training as local

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(local, "build_trainer", no_loading)
    monkeypatch.setattr(local, "build_engine", no_loading)
    taken = socket.socket()  # a port some other program listens on
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cases = [
        ("workflow=tests/integration/toy_app.py:nothing_here", WorkflowError, "nothing_here"),
        ("judge=tests/integration/toy_app.py:uppercase_share", WorkflowError, "async function"),
        (f"tasks.eval={tmp_path / 'none.jsonl'}", TaskSetError, "does not exist"),
        (f"tasks.val={tmp_path}", TaskSetError, "is a folder, not a file"),
        ("model.name_or_path=/no/model", ModelNotFoundError, "unknown model"),
        ("engine.device=cuda:0", ConfigError, "no CUDA device"),
        ("model.chat_template=nope", ConfigError, "neither a template nor a file"),
        ("explorer.group_size=1", ConfigError, "group_size 1 with .* 'grpo' trains nothing"),
        (f"gateway.port={taken.getsockname()[1]}", ConfigError, "set gateway.port to a free"),
    ]
    if torch.cuda.is_available():
        cases = [c for c in cases if "cuda" not in c[0]]
    for i, (override, error, fragment) in enumerate(cases):
        config = toy_config(tiny_model_path, toy_tasks, tmp_path / f"r{i}", override)
        started = time.perf_counter()
        with pytest.raises(error, match=fragment):
            await train(config, tmp_path / f"r{i}")
        if i == 0:  # the bad workflow: reported at once (no model, no task file read)
            assert time.perf_counter() - started < 5
        assert not (tmp_path / f"r{i}").exists()
    taken.close()


async def test_explore_stops_cleanly_with_the_finished_tasks_written(
    tiny_model_path, toy_tasks, tmp_path
):
    from agentscope_rft.runtime.explore import explore

    config = toy_config(
        tiny_model_path,
        toy_tasks,
        tmp_path / "run",
        "workflow=tests/integration/toy_app.py:slow",
        "explorer.group_size=1",
        "explorer.max_concurrency=2",
    )
    out, stop = tmp_path / "explore", RunStop()
    job = asyncio.create_task(explore(config, out, stop=stop))
    results = out / "results.jsonl"
    while not (results.is_file() and results.read_text().strip()):
        assert not job.done(), job.exception()
        await asyncio.sleep(0.05)
    stop.request("SIGTERM")
    started = time.perf_counter()
    with pytest.raises(RunStopped, match=r"stopped on SIGTERM after 2 of 8 tasks"):
        await job
    assert time.perf_counter() - started < 30
    assert len(results.read_text().splitlines()) == 2
    assert json.loads((out / "summary.json").read_text())["explore/rollouts"] == 2


async def test_a_resume_drops_the_records_of_the_step_the_crash_cut_off(
    tiny_model_path, toy_tasks, tmp_path
):
    """A run killed after exploring a step it never trained left that step's rollouts, samples
    and diagnoses; the resumed run explored it again and the logs held the step twice."""
    from agentscope_rft.runtime.components import load_resumed_config

    run_dir = tmp_path / "run"
    small = ("explorer.group_size=2", "explorer.tasks_per_step=2", "run.checkpoint_every=1")
    await train(toy_config(tiny_model_path, toy_tasks, run_dir, *small, "run.steps=2"), run_dir)
    for name in ("rollouts.jsonl", "samples.jsonl"):  # step 1 again: explored, not trained
        lines = (run_dir / name).read_text().splitlines()
        again = [json.dumps({**json.loads(x), "step": 2}) for x in lines if '"step": 1,' in x]
        assert again
        (run_dir / name).write_text("\n".join([*lines, *again, '{"step": 2, "pha']))  # torn
    await train(load_resumed_config(run_dir, ["run.steps=3"]), run_dir, resume=True)

    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    per_step = [sum(r["step"] == step for r in rollouts) for step in range(3)]
    assert per_step == [4, 4, 4]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [0, 1, 2]
    step2 = {s["rollout_id"] for s in samples if s["step"] == 2}
    assert step2 == {r["rollout_id"] for r in rollouts if r["step"] == 2}


def sft_config(model: str, run_dir: Path, *extra: str):
    """One step of SFT on the test data: a run folder in seconds."""
    return load_config(
        None,
        [
            f"model.name_or_path={model}",
            f"offline.path={Path(__file__).parents[1] / 'data' / 'sft_tiny.jsonl'}",
            "algorithm.objective=sft",
            "trainer.dtype=float32",
            "monitor.tensorboard=false",
            "run.mode=offline",
            "run.steps=1",
            f"run.dir={run_dir}",
            *extra,
        ],
    )


async def test_resuming_from_a_damaged_checkpoint_names_it_and_the_way_on(
    tiny_model_path, tmp_path
):
    """A checkpoint whose trainer.pt was cut short (a full disk, a copy interrupted) is named
    with the fork that continues from an older one (it was torch's zip-reader traceback)."""
    from agentscope_rft.runtime.components import RunFolderError

    run_dir = tmp_path / "run"
    await train(sft_config(tiny_model_path, run_dir), run_dir)
    trainer_state = run_dir / "checkpoints" / "step-000001" / "trainer.pt"
    trainer_state.write_bytes(trainer_state.read_bytes()[:1000])
    resumed = load_config(run_dir / "config.yaml", ["run.steps=2"])
    with pytest.raises(RunFolderError, match=r"cannot resume from .*step-000001: ") as error:
        await train(resumed, run_dir, resume=True)
    assert f"--fork-from {run_dir} --fork-step <step>" in str(error.value)


async def test_a_run_whose_metrics_file_was_lost_resumes_from_its_checkpoint(
    tiny_model_path, tmp_path
):
    """metrics.jsonl deleted (or never copied along): the checkpoint still resumes, saying what
    is missing (it was a MetricsFileError traceback from the health watcher's history)."""
    run_dir = tmp_path / "run"
    await train(sft_config(tiny_model_path, run_dir), run_dir)
    (run_dir / "metrics.jsonl").unlink()
    await train(load_config(run_dir / "config.yaml", ["run.steps=2"]), run_dir, resume=True)
    assert [r["step"] for r in train_lines(run_dir)] == [1]
    assert json.loads((run_dir / "state.json").read_text())["step"] == 2


async def test_an_offline_run_resumed_with_another_batch_size_trains_every_sample_once_per_epoch(
    tiny_model_path, tmp_path, monkeypatch
):
    """3 SFT steps of 2 samples, stopped, resumed with offline.batch_size=3: the resumed steps
    go on with the 7th sample of the first epoch. The resume skipped 3 batches of the new size
    (9 samples), so samples 7-9 of the stream were never trained."""
    import agentscope_rft.runtime.training as training

    trained: list[str] = []
    build = training.build_trainer

    class Recording:
        def __init__(self, trainer) -> None:
            self._trainer = trainer

        def step(self, samples, step):
            trained.extend(s.sample_id for s in samples)
            return self._trainer.step(samples, step)

        def __getattr__(self, name):
            return getattr(self._trainer, name)

    monkeypatch.setattr(training, "build_trainer", lambda *a, **k: Recording(build(*a, **k)))
    data = tmp_path / "sft.jsonl"
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(7)))
    run_dir = tmp_path / "run"
    first = sft_config(tiny_model_path, run_dir, f"offline.path={data}", "offline.batch_size=2")
    first.run.steps = 3
    await train(first, run_dir)
    assert len(trained) == 6
    resumed = load_config(run_dir / "config.yaml", ["offline.batch_size=3", "run.steps=5"])
    await train(resumed, run_dir, resume=True)
    every = {f"sft.jsonl:{line}" for line in range(1, 8)}
    assert len(trained) == 12
    assert set(trained[:7]) == every  # the first epoch: each sample once
    assert len(set(trained[7:])) == 5  # the second epoch under way: none twice


async def test_a_step_saved_again_is_not_marked_whole_until_it_is(tiny_model_path, tmp_path):
    """Step 2's checkpoint was written whole by a run killed before committing it; the resume
    redoes step 2 and is killed while saving it again. The folder kept the first attempt's
    run_state.json beside half-rewritten weights, so a fork or rollback took it for whole."""
    import agentscope_rft.runtime.training as training

    run_dir = tmp_path / "run"
    await train(
        sft_config(tiny_model_path, run_dir, "run.steps=2", "run.checkpoint_every=1"), run_dir
    )
    write_state(run_dir, {"step": 1})  # the kill came before step 2 was committed
    build = training.build_trainer

    class Killed(Exception):
        """Where a kill -9 would end the process."""

    class KilledWhileExporting:
        def __init__(self, trainer) -> None:
            self._trainer = trainer

        def export_hf(self, target):
            raise Killed

        def __getattr__(self, name):
            return getattr(self._trainer, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            training, "build_trainer", lambda *a, **k: KilledWhileExporting(build(*a, **k))
        )
        with pytest.raises(Killed):
            await train(load_config(run_dir / "config.yaml"), run_dir, resume=True)
    assert (run_dir / "checkpoints" / "step-000002" / "trainer.pt").is_file()  # rewritten
    assert not (run_dir / "checkpoints" / "step-000002" / "run_state.json").exists()


async def test_an_offline_resume_with_another_seed_keeps_the_epoch_in_progress(
    tiny_model_path, tmp_path, monkeypatch
):
    """3 SFT steps of 2 samples of 7, resumed with another run.seed: the rest of the first epoch
    was drawn from the new seed's shuffle, so some samples were trained twice in it and others
    not at all. The run keeps the order it drew; other data starts at a new epoch."""
    from agentscope_rft.runtime.offline import offline_batches

    data = tmp_path / "sft.jsonl"
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(7)))
    config = sft_config(tiny_model_path, tmp_path / "run", f"offline.path={data}")
    config.offline.batch_size = 2
    first = offline_batches(config)
    trained = [s.sample_id for _ in range(3) for s in next(first)]
    state = first.state()
    config.run.seed = 7
    resumed = offline_batches(config, 3, saved=state)
    trained += [s.sample_id for s in next(resumed)]
    assert sorted(trained[:7]) == sorted(f"sft.jsonl:{line}" for line in range(1, 8))
    assert resumed.state()["offline_stream"]["seed"] == 0  # and so on, at every later resume
    # other samples in the file: they start at their first epoch
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for _ in range(9)))
    fresh = offline_batches(config, 3, saved=state)
    assert fresh.consumed == 0 and len(next(fresh)) == 2
