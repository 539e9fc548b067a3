"""Calls become samples: exact-prefix merges, each break reason, length splits, reward spreads."""

from __future__ import annotations

import pytest

from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.types import Call, Rollout, StepReward


def call(
    n: int,
    prompt: list[int],
    completion: list[int],
    *,
    agent: str | None = None,
    temperature: float = 1.0,
    choice: int = 0,
    request: str | None = None,
    version: int = 0,
) -> Call:
    return Call(
        call_id=f"c{n}-{choice}",
        request_id=request or f"q{n}",
        rollout_id="r",
        agent_name=agent,
        messages=[],
        tools=None,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-0.1 * (i + 1) for i in range(len(completion))],
        finish_reason="stop",
        policy_version=version,
        choice_index=choice,
        temperature=temperature,
        started_at=float(n),
    )


def rollout(calls: list[Call], reward: float = 1.0, **kwargs) -> Rollout:
    return Rollout("r", "t", {}, calls, reward, **kwargs)


# A three-call tool loop: every prompt extends the previous prompt + completion exactly.
P0, C0 = [1, 2, 3], [10, 11]
P1, C1 = [*P0, *C0, 4, 5], [12]
P2, C2 = [*P1, *C1, 6], [13, 14, 15]
LOOP = [call(0, P0, C0), call(1, P1, C1), call(2, P2, C2)]


def test_an_exact_prefix_chain_is_one_sample_with_the_gaps_masked():
    [sample], stats = build_samples(rollout(LOOP, reward=0.5), group_id="g")
    assert list(sample.token_ids) == [*P2, *C2]
    #                          P0       C0    tool   C1  tool  C2
    assert list(sample.loss_mask) == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    assert list(sample.logprobs) == pytest.approx(
        [0, 0, 0, -0.1, -0.2, 0, 0, -0.1, 0, -0.1, -0.2, -0.3]
    )
    assert sample.reward == 0.5 and sample.token_rewards is None and sample.num_calls == 3
    assert sample.group_id == "g"
    assert stats.merges == 2 and not stats.breaks
    assert stats.metrics()["trajectory/merge_rate"] == 1.0


def test_the_sample_carries_its_oldest_policy_version():
    calls = [call(0, P0, C0, version=3), call(1, P1, C1, version=4)]
    [sample], _ = build_samples(rollout(calls))
    assert sample.policy_version == 3


@pytest.mark.parametrize(
    ("second", "reason"),
    [
        # A token inside the first prompt changed (e.g. an injected timestamp).
        (call(1, [1, 9, 3, *C0, 4], [12]), "history_rewritten"),
        # The reply came back re-tokenized: it differs inside the first completion.
        (call(1, [*P0, 10, 99, 4], [12]), "completion_retokenized"),
        # The same history, sampled at another temperature.
        (call(1, P1, C1, temperature=0.5), "settings_changed"),
    ],
)
def test_each_break_reason_is_counted(second, reason):
    samples, stats = build_samples(rollout([call(0, P0, C0), second]))
    assert len(samples) == 2
    assert dict(stats.breaks) == {reason: 1} and stats.merges == 0
    metrics = stats.metrics()
    assert metrics[f"trajectory/break/{reason}"] == 1.0
    assert metrics["trajectory/merge_rate"] == 0.0
    assert [list(s.token_ids) for s in samples] == [
        [*P0, *C0],
        [*second.prompt_ids, *second.completion_ids],
    ]


def test_copies_of_an_agent_asked_the_same_question_are_siblings_not_breaks():
    # A fan-out: two requests with one prompt, each conversation continued in a later turn.
    sibling = [20, 21]
    calls = [
        call(0, P0, C0),
        call(1, P0, sibling),
        call(2, P1, C1),
        call(3, [*P0, *sibling, 4, 5], [16]),
    ]
    samples, stats = build_samples(rollout(calls))
    assert [s.num_calls for s in samples] == [2, 2]
    assert not stats.breaks and stats.merges == 2
    assert stats.metrics()["trajectory/merge_rate"] == 1.0


def test_max_sample_length_splits_a_chain_that_would_grow_past_it():
    # The whole chain is 12 tokens; with a limit of 9 the third call cannot join (12 > 9).
    samples, stats = build_samples(rollout(LOOP), max_length=9)
    assert [len(s.token_ids) for s in samples] == [8, 12]
    assert dict(stats.breaks) == {"max_length": 1} and stats.merges == 1
    assert list(samples[0].token_ids) == [*P1, *C1]
    # The split-off sample re-reads its whole prompt (masked) and trains only its completion.
    assert list(samples[1].loss_mask) == [0] * len(P2) + [1] * len(C2)
    assert [s.num_calls for s in samples] == [2, 1]
    # Without a limit the same calls merge into one sample.
    assert len(build_samples(rollout(LOOP))[0]) == 1


def test_extra_choices_nobody_continued_are_dropped():
    calls = [
        call(0, P0, C0, choice=0, request="q0"),
        call(0, P0, [20, 21], choice=1, request="q0"),
        call(1, P1, C1),
    ]
    samples, stats = build_samples(rollout(calls))
    assert [list(s.token_ids) for s in samples] == [[*P1, *C1]]
    assert stats.dropped_choices == 1


def test_agents_get_their_own_samples():
    calls = [
        call(0, P0, C0, agent="a"),
        call(1, [7, 8], [30], agent="b"),
        call(2, P1, C1, agent="a"),
    ]
    samples, stats = build_samples(rollout(calls))
    assert {s.agent_name: list(s.token_ids) for s in samples} == {
        "a": [*P1, *C1],
        "b": [7, 8, 30],
    }
    assert stats.merges == 1 and not stats.breaks


# Ends of the three calls in the merged sample: C0 ends at 4, C1 at 7, C2 at 11.
ENDS = [4, 7, 11]


@pytest.mark.parametrize(
    ("spread", "gamma", "at_ends", "outcome"),
    [
        ("outcome", 1.0, None, 2.0),
        ("last_call", 1.0, [0.0, 0.0, 2.0], 0.0),
        ("each_call", 1.0, [2.0, 2.0, 2.0], 0.0),
        ("discounted", 0.5, [0.5, 1.0, 2.0], 0.0),  # 2 * 0.5^2, 2 * 0.5, 2
    ],
)
def test_reward_spread_puts_the_episode_reward_where_it_says(spread, gamma, at_ends, outcome):
    [sample], _ = build_samples(rollout(LOOP, reward=2.0), reward_spread=spread, gamma=gamma)
    assert sample.reward == outcome
    assert sample.metrics["episode_reward"] == 2.0
    assert sample.metrics["episode_success"] == 0.0  # (the rollout did not succeed)
    if at_ends is None:
        assert sample.token_rewards is None
        return
    expected = [0.0] * len(sample.token_ids)
    for end, value in zip(ENDS, at_ends, strict=True):
        expected[end] = value
    assert list(sample.token_rewards or []) == pytest.approx(expected)


def test_samples_carry_whether_their_episode_succeeded():
    [sample], _ = build_samples(rollout(LOOP, reward=0.5, success=True))
    assert sample.metrics == {"episode_reward": 0.5, "episode_success": 1.0}


def test_emitted_step_rewards_land_at_the_end_of_their_call_in_any_spread():
    steps = [StepReward(0.25, call_index=0), StepReward(0.5, call_index=7)]  # 7: past the end
    [sample], _ = build_samples(
        rollout(LOOP, reward=1.0, step_rewards=steps), reward_spread="last_call"
    )
    expected = [0.0] * 12
    expected[ENDS[0]] = 0.25
    expected[ENDS[2]] = 0.5 + 1.0  # the clamped step reward plus the spread outcome
    assert list(sample.token_rewards or []) == pytest.approx(expected)


def test_a_call_with_an_empty_completion_hands_its_reward_to_a_sampled_call():
    # The loop, then a fourth call that sampled nothing (its prompt extends the third's).
    empty_last = [*LOOP, call(3, [*P2, *C2, 7], [])]
    [sample], _ = build_samples(rollout(empty_last, reward=2.0), reward_spread="last_call")
    assert sample.num_calls == 3 and len(sample.token_ids) == 12  # its prompt tail is not kept
    expected = [0.0] * 12
    expected[ENDS[2]] = 2.0  # on the last sampled token, never on an untrained one
    assert list(sample.token_rewards or []) == pytest.approx(expected)

    # An emitted reward of an empty first call goes to the next call that sampled.
    empty_first = [call(0, P0, []), *LOOP[1:]]
    steps = [StepReward(0.25, call_index=0)]
    [sample], _ = build_samples(rollout(empty_first, step_rewards=steps), reward_spread="outcome")
    assert sample.loss_mask == [0] * 7 + [1] + [0] + [1, 1, 1]
    assert sample.token_rewards is not None and sample.token_rewards[7] == 0.25
    assert sum(sample.token_rewards) == 0.25


def test_anchor_states_of_calls_with_empty_completions_do_not_break_the_batch():
    from agentscope_rft.trainers.batch import build_batch
    from agentscope_rft.types import StepState

    calls = [*LOOP[:2], call(2, P2, [])]
    states = [StepState(f"s{i}", call_index=i) for i in range(3)]
    [sample], _ = build_samples(rollout(calls, step_states=states))
    assert sample.step_states == ["s0", "s1"]
    batch = build_batch([sample], pad_id=0)
    assert batch.step_state_ids[0, ENDS[0]] == 0 and batch.step_state_ids[0, ENDS[1]] == 1
