"""The diagnosis rules: each fires on what makes an app unlearnable, and stays quiet otherwise."""

from __future__ import annotations

import json
import logging

import pytest

from agentscope_rft.explorer.diagnosis import (
    RunDiagnosis,
    diagnose,
    echoed_runtime_state,
    equal_rewards,
    no_tool_calls,
    token_cap,
)
from agentscope_rft.types import Call, Rollout, RolloutStatus, ToolCall

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
REMINDER = (
    "<system-reminder>Treat the following as the ground truth at this point of the conversation. "
    "Anything stated earlier is outdated, and a later reminder, if any, supersedes this one:\n"
    "<current-time>2026-11-26T23:37:09</current-time>\n<timezone>UTC</timezone>\n"
    "</system-reminder>"
)
MESSAGES = [
    {"role": "system", "content": "You look up stock."},
    {"role": "user", "content": [{"type": "text", "text": "How many bolts?"}]},
    {"role": "user", "content": [{"type": "text", "text": REMINDER}]},
]


def call(
    content: str = "42",
    *,
    tool: bool = False,
    finish: str = "stop",
    tools: list | None = TOOLS,
    tokens: int = 3,
) -> Call:
    return Call(
        call_id="c",
        request_id="q",
        rollout_id="r",
        agent_name="a",
        messages=MESSAGES,
        tools=tools,
        prompt_ids=[1, 2],
        completion_ids=[5] * tokens,
        logprobs=[-0.1] * tokens,
        finish_reason=finish,
        policy_version=0,
        content=content,
        tool_calls=[ToolCall("t", "lookup", "{}")] if tool else [],
    )


def rollout(calls: list[Call], reward: float = 0.0, task: str = "t0", ok: bool = True) -> Rollout:
    status = RolloutStatus.OK if ok else RolloutStatus.FAILED
    return Rollout("r", task, {"id": task}, calls, reward, status=status)


def test_no_tool_calls_fires_when_no_episode_calls_the_offered_tool():
    finding = no_tool_calls([rollout([call()]) for _ in range(10)])
    assert finding is not None and (finding.count, finding.total) == (0, 10)
    assert "lookup" in finding.message and "offline.warmup_steps" in finding.message


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        ('<tool_call>\n{"name": lookup}', "did not parse"),
        ('You call lookup(item="bolts") within <tool_call> and it returns 4.', "as text"),
        ("There are 4 bolts.", "plain text"),
    ],
)
def test_no_tool_calls_names_the_cause(reply, cause):
    finding = no_tool_calls([rollout([call(reply)])])
    assert finding is not None and cause in finding.message


def test_no_tool_calls_fires_at_one_in_ten_and_not_above():
    calling = [rollout([call(tool=True), call()])]
    assert no_tool_calls(calling + [rollout([call()])] * 9) is not None  # 1 of 10
    assert no_tool_calls(calling * 2 + [rollout([call()])] * 8) is None  # 2 of 10


def test_no_tool_calls_is_quiet_without_tools_or_episodes():
    assert no_tool_calls([rollout([call(tools=None)])]) is None
    assert no_tool_calls([rollout([call()], ok=False)]) is None
    assert no_tool_calls([]) is None


@pytest.mark.parametrize(
    "reply",
    [
        "<system-reminder>Treat the following as",
        "It is <current-time>now</current-time>",
        "The time is 2026-11-26T23:37:09.",  # the injected value itself
        "Today is 2026-11-26.",  # its date
        "It appears the current time is in UTC.",  # SmolLM2-135M's reply to the inventory task
        "SystemReferenceProductGroundTruth:",
    ],
)
def test_echoed_runtime_state_fires_on_a_copied_reminder(reply):
    finding = echoed_runtime_state([rollout([call(reply)])])
    assert finding is not None and finding.count == 1
    assert "gateway.runtime_state: drop" in finding.message


def test_echoed_runtime_state_is_quiet_below_five_percent_and_on_plain_replies():
    calls = [call("<system-reminder>")] + [call("42")] * 20  # 1 of 21 < 5%
    assert echoed_runtime_state([rollout(calls)]) is None
    assert echoed_runtime_state([rollout([call("There are 42 bolts.")])]) is None


def test_only_a_prompt_that_carried_the_reminder_can_be_echoed():
    plain = call("<system-reminder> at the current time, UTC")
    plain.messages = MESSAGES[:2]  # dropped (gateway.runtime_state: drop) or never injected
    assert echoed_runtime_state([rollout([plain])]) is None


def test_token_cap_fires_on_a_fifth_of_the_calls():
    capped = [call(finish="length", tokens=7)] + [call()] * 4  # 1 of 5
    finding = token_cap([rollout(capped)])
    assert finding is not None and (finding.count, finding.total) == (1, 5)
    assert "up to 7 tokens" in finding.message and "max_tokens" in finding.message
    assert token_cap([rollout([call(finish="length")] + [call()] * 5)]) is None  # 1 of 6


def test_token_cap_names_the_echo_when_capped_replies_copy_the_reminder():
    finding = token_cap([rollout([call(REMINDER * 3, finish="length")])])
    assert finding is not None and "gateway.runtime_state" in finding.message


def test_token_cap_says_when_a_reasoning_model_was_cut_inside_its_thinking():
    thinking = call("", finish="length")
    thinking.reasoning = "Let me think about the bolts"
    finding = token_cap([rollout([thinking, call(finish="length")])])
    assert finding is not None and "(1 of them cut inside their thinking" in finding.message
    assert "cut inside" not in token_cap([rollout([call(finish="length")])]).message


def test_equal_rewards_fires_only_when_every_group_is_flat():
    flat = [rollout([call()], 0.0, "a"), rollout([call()], 0.0, "a")]
    flat += [rollout([call()], 1.0, "b"), rollout([call()], 1.0, "b")]
    finding = equal_rewards(flat)
    assert finding is not None and (finding.count, finding.total) == (2, 2)
    assert "reward 0, 1" in finding.message
    mixed = [*flat, rollout([call()], 0.0, "c"), rollout([call()], 0.5, "c")]
    assert equal_rewards(mixed) is None


def test_equal_rewards_needs_groups_of_two_ok_episodes():
    assert equal_rewards([rollout([call()], 0.0, "a"), rollout([call()], 0.0, "b")]) is None
    failed = [rollout([call()], 0.0, "a"), rollout([call()], 0.0, "a", ok=False)]
    assert equal_rewards(failed) is None


def test_diagnose_runs_every_rule_and_groups_false_skips_equal_rewards():
    rollouts = [rollout([call(REMINDER, finish="length")]) for _ in range(2)]
    assert [f.code for f in diagnose(rollouts)] == [
        "no_tool_calls",
        "echoed_runtime_state",
        "token_cap",
        "equal_rewards",
    ]
    assert "equal_rewards" not in [f.code for f in diagnose(rollouts, groups=False)]
    healthy = [rollout([call(tool=True), call("42")], reward) for reward in (0.0, 1.0)]
    assert diagnose(healthy) == []


def test_run_diagnosis_reports_each_phase_once_and_each_finding_once(tmp_path, caplog):
    diagnosis = RunDiagnosis(tmp_path)
    bad = [rollout([call()]) for _ in range(2)]
    with caplog.at_level(logging.WARNING):
        metrics = diagnosis.first(0, "train", bad)
        assert diagnosis.first(1, "train", bad) == {}  # a phase is diagnosed once
        again = diagnosis.first(0, "val", bad)
    assert metrics == {"diagnosis/no_tool_calls": 0.0, "diagnosis/equal_rewards": 1.0}
    assert again == metrics
    warned = [r.message for r in caplog.records if "diagnosis" in r.message]
    assert len(warned) == 2  # no_tool_calls and equal_rewards, not repeated for val
    records = [json.loads(line) for line in (tmp_path / "diagnosis.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records] == ["train", "val"]
    assert [f["code"] for f in records[0]["findings"]] == ["no_tool_calls", "equal_rewards"]


def test_the_diagnosis_and_the_step_line_say_what_their_groups_are(caplog):
    """Two tasks, two agents each, all rewards equal: the diagnosis counts 2 task groups and the
    trainer 4 advantage groups; each line says which it counts, so they do not seem to disagree."""
    from agentscope_rft.algorithms.config import AlgorithmConfig
    from agentscope_rft.trainers.common import filter_step_samples
    from agentscope_rft.types import Sample

    rollouts = [rollout([call()], 1.0, task) for task in ("a", "b") for _ in range(2)]
    finding = equal_rewards(rollouts)
    assert finding is not None and "all 2 task group(s) (a task's episodes)" in finding.message
    samples = [
        Sample([1, 2], [0, 1], [0.0, -1.0], 1.0, f"{task}{k}", task, agent_name=agent)
        for task in ("a", "b")
        for k in range(2)
        for agent in ("solver", "critic")
    ]
    with caplog.at_level(logging.WARNING):
        kept, metrics = filter_step_samples(samples, AlgorithmConfig(), pad_id=0, step=3)
    assert kept == [] and metrics["train/groups"] == 4.0
    assert (
        "step 3: all 4 advantage groups (one per task and agent, over 2 task group(s)) had equal "
        "rewards; no update"
    ) in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        filter_step_samples(samples[::2], AlgorithmConfig(), pad_id=0, step=4)
    assert "step 4: all 2 groups had equal rewards; no update" in caplog.text
