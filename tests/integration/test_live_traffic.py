"""Training from live traffic: `serve --record` writes finished rollouts as episodes a run's
dashboard reviews, and `train` with `offline.format: review` trains on them."""

import json
import os
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentscope_rft.dashboard.episodes import check_review_targets, episode_detail, list_episodes
from agentscope_rft.dashboard.runs import discover_runs, metrics_payload, summarize
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.gateway.live import LiveRecording, add_live_routes
from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.review.store import ReviewStore, parse_review


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def live(tiny_model_path, tmp_path):
    """A serving gateway recording to `tmp_path/traffic`, its recorder on a hand-moved clock."""
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_model_len=512)
    await engine.start()
    clock = Clock()
    recording = LiveRecording(tmp_path / "traffic", tiny_model_path)
    gateway = Gateway(engine, recorder=CallRecorder(max_age=600, clock=clock))
    add_live_routes(gateway.app, gateway.state, recording)
    await gateway.start()
    gateway.clock = clock
    try:
        yield gateway
    finally:
        await gateway.stop()
        await engine.close()


async def chat(gateway, rollout, text):
    client = openai.AsyncOpenAI(
        base_url=gateway.rollout_base_url(rollout), api_key="-", max_retries=0
    )
    return await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=6, temperature=1.0
    )


async def post(gateway, path, body):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
        return await http.post(path, json=body)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_recorded_episodes_are_reviewed_and_trained_on(
    live, tmp_path, tiny_model_path, caplog
):
    from agentscope_rft.config import load_config
    from agentscope_rft.models import load_tokenizer
    from agentscope_rft.review.training import ReviewDataError, load_review_samples
    from agentscope_rft.runtime.local import train

    gateway = live
    await chat(gateway, "u1", "Say hi")
    await chat(gateway, "u2", "Say bye")
    await chat(gateway, "u3", "Say hi")
    calls = {rid: gateway.recorder.calls(rid) for rid in ("u1", "u2", "u3")}
    task = {"id": "greet", "topic": "hi"}
    ended = await post(gateway, "/rollouts/u1/end", {"reward": 1.0, "task": task})
    assert ended.status_code == 200 and ended.json()["samples"] == 1
    assert (await post(gateway, "/rollouts/u2/end", {})).json()["reward"] is None
    # u3 answers u1's task but gets no reward: it is left out of u1's group, not counted as 0
    assert (await post(gateway, "/rollouts/u3/end", {"task": task})).json()["task_id"] == "greet"
    # feedback arrives late: a reward for u2 after its end
    assert (await post(gateway, "/rollouts/u2/reward", {"reward": -1.0})).status_code == 200

    folder = tmp_path / "traffic"
    episodes = {e["rollout_id"]: e for e in lines(folder / "rollouts.jsonl")}
    assert episodes["u1"]["reward"] == 1.0 and episodes["u1"]["task"] == task
    assert episodes["u1"]["task_id"] != episodes["u2"]["task_id"]  # two prompts: two tasks
    for sample in lines(folder / "samples.jsonl"):
        [call] = calls[sample["rollout_id"]]
        assert sample["token_ids"] == call.prompt_ids + call.completion_ids
        assert sample["loss_mask"] == [0] * len(call.prompt_ids) + [1] * len(call.completion_ids)
        assert sample["logprobs"][len(call.prompt_ids) :] == [round(x, 4) for x in call.logprobs]
        assert sample["policy_version"] == 0 and sample["phase"] == "train"
    assert yaml.safe_load((folder / "config.yaml").read_text())["model"]["name_or_path"] == (
        tiny_model_path
    )
    # the dashboard lists the folder as a run and accepts reviews of its episodes
    [ref] = discover_runs(tmp_path)
    assert list_episodes(ref)["total"] == 3
    assert summarize(ref)["status"] == "recording"  # not "stopped", as a run without status
    an_hour_ago = time.time() - 3600
    os.utime(folder / "rollouts.jsonl", (an_hour_ago, an_hour_ago))
    assert summarize(ref)["status"] == "recorded"
    # its Curves tab says why there are none (the metrics request failed: "no metrics yet")
    assert metrics_payload(ref)["note"].startswith("live traffic recorded by `serve --record`")
    detail = episode_detail(ref, "u1")  # decoded with the served model's tokenizer
    assert "".join(detail["samples"][0]["tokens"]).count("Say hi") == 1
    assert [r["reviewer"] for r in detail["reviews"]] == ["app"]
    check_review_targets(ref, parse_review({"kind": "rating", "rollout_id": "u2", "score": 0}))
    assert {r.rollout_id: r.score for r in ReviewStore(folder).current()} == {"u1": 1.0, "u2": -1.0}

    rated = load_review_samples(folder, "rewards", load_tokenizer(tiny_model_path))
    assert sorted((s.rollout_id, s.reward) for s in rated) == [("u1", 1.0), ("u2", -1.0)]

    def config(*extra):
        return load_config(
            None,
            [
                f"model.name_or_path={tiny_model_path}",
                "run.mode=offline",
                "offline.format=review",
                f"offline.path={folder}",
                "offline.batch_size=3",
                "algorithm.objective=rl",
                "trainer.dtype=float32",
                "trainer.lr=1e-3",
                "run.steps=1",
                f"run.dir={tmp_path / 'trained'}",
                "monitor.tensorboard=false",
                *extra,
            ],
        )

    # one episode per prompt: GRPO has no group to compare with; the run says so
    with pytest.raises(ReviewDataError, match="reinforce_plus_plus"):
        await train(config(), tmp_path / "trained")
    with caplog.at_level("INFO", logger="agentscope_rft.runtime.offline"):
        metrics = await train(
            config("algorithm.advantage=reinforce_plus_plus"), tmp_path / "trained"
        )
    assert metrics["grad_norm"] > 0
    # the batch counts groups (they stay whole), not samples
    assert f"offline.batch_size 3 is more than the 2 rated groups of {folder}" in caplog.text
    before = load_file(Path(tiny_model_path) / "model.safetensors")
    after = load_file(tmp_path / "trained/checkpoints/step-000001/model/model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)


async def test_bad_calls_get_openai_errors_and_an_idle_rollout_is_written(
    live, tmp_path, tiny_model_path, monkeypatch
):
    gateway = live
    # the gateway remembers few closed ids: a written one stays refused once it is forgotten
    monkeypatch.setattr("agentscope_rft.gateway.app.CLOSED_ROLLOUTS_KEPT", 1)
    unknown = await post(gateway, "/rollouts/nope/end", {})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "rollout_not_found"
    await chat(gateway, "a", "Say hi")
    bad = await post(gateway, "/rollouts/a/end", {"reward": "good"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    assert (await post(gateway, "/rollouts/a/end", {"rewrd": 1})).status_code == 400
    assert (await post(gateway, "/rollouts/a/reward", {"reward": 1})).status_code == 409
    assert (await post(gateway, "/rollouts/nope/reward", {"reward": 1})).status_code == 404
    assert (await post(gateway, "/rollouts/a/end", {"reward": 0.5})).status_code == 200
    assert (await post(gateway, "/rollouts/a/end", {})).status_code == 409
    with pytest.raises(openai.APIStatusError) as closed:
        await chat(gateway, "a", "more")
    assert closed.value.status_code == 410

    # a rollout nobody ends is written when it has been idle past the bound
    await chat(gateway, "idle", "Say hi")
    gateway.clock.now += 601
    gateway.recorder.sweep()
    written = {e["rollout_id"]: e for e in lines(tmp_path / "traffic" / "rollouts.jsonl")}
    assert written["idle"]["ended"] == "age" and written["idle"]["reward"] is None
    assert gateway.recorder.calls("idle") == []
    with pytest.raises(openai.APIStatusError, match="recorded in") as again:
        await chat(gateway, "a", "a second episode under a written id")
    assert again.value.status_code == 410

    # a crash mid-line: serve --record on the folder again drops the torn line, keeps the
    # episodes, and refuses a new episode under an id it holds
    with (tmp_path / "traffic" / "rollouts.jsonl").open("a") as handle:
        handle.write('{"rollout_id": "tor')
    again = LiveRecording(tmp_path / "traffic", tiny_model_path)
    assert again.episodes == {"a", "idle"}
    with pytest.raises(ValueError, match="record to a new folder"):
        LiveRecording(tmp_path / "traffic", "another-model")
    # a model folder named from where serve runs is the same model, and is written absolute
    # (the dashboard, elsewhere, could not load a relative one's tokenizer)
    monkeypatch.chdir(Path(tiny_model_path).parent)
    LiveRecording(tmp_path / "traffic", "./" + Path(tiny_model_path).name)
    LiveRecording(tmp_path / "relative", "./" + Path(tiny_model_path).name)
    written = yaml.safe_load((tmp_path / "relative" / "config.yaml").read_text())
    assert written["model"]["name_or_path"] == str(Path(tiny_model_path).resolve())


async def test_an_agentscope_tool_episode_is_one_sample_with_a_span_per_call(tmp_path):
    """A multi-turn AgentScope agent (tool calls, tool results) served live: its calls continue
    each other, so the episode is one training sample, tool results masked, as in a run."""
    from agentscope_rft.testing import ScriptedEngine

    from . import calc_app

    script = iter(calc_app.SCRIPT)
    recording = LiveRecording(tmp_path / "traffic", "tiny-random")
    gateway = Gateway(ScriptedEngine(lambda messages, tools: next(script)))
    add_live_routes(gateway.app, gateway.state, recording)
    async with gateway:
        await calc_app.run_episode(gateway.rollout_base_url("conversation-7"))
        assert (await post(gateway, "/rollouts/conversation-7/end", {"reward": 1})).json()[
            "calls"
        ] == 3
    [sample] = lines(tmp_path / "traffic" / "samples.jsonl")
    assert sample["num_calls"] == 3 and len(sample["call_spans"]) == 3
    assert sample["break_reason"] is None and sample["reward"] == 1.0


async def test_ending_a_rollout_on_a_server_that_does_not_record_says_how_to():
    from agentscope_rft.gateway.live import add_unrecording_routes
    from agentscope_rft.testing import ScriptedEngine

    gateway = Gateway(ScriptedEngine(lambda messages, tools: "hi"))
    add_unrecording_routes(gateway.app, gateway.state)
    async with gateway:
        for path in ("/rollouts/r/end", "/rollouts/r/reward"):
            refused = await post(gateway, path, {"reward": 1})
            assert refused.status_code == 404 and "--record" in refused.json()["error"]["message"]
