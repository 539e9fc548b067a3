"""Turning an episode's recorded calls into training samples, without re-tokenizing anything.

Per agent, calls are taken in order. A call extends an open sample when that sample's tokens are
an exact prefix of the call's prompt: the tokens in between (tool results, user turns, hints) get
loss mask 0 and the completion loss mask 1. Otherwise the call starts a new sample, and the reason
is counted:

- `history_rewritten`: the prompt differs inside the earlier prompt (context compression, an
  injected timestamp, a template that is not append-only);
- `completion_retokenized`: it differs inside the earlier completion (the app's re-rendered reply
  tokenizes differently from what was sampled, or the app edited the reply);
- `settings_changed`: the sampling temperature changed;
- `max_length`: merging would exceed the training length limit.

A call whose prompt equals an earlier call's (copies of an agent asked the same question, a resent
request) starts a sample of its own without counting as a break.

Extra choices of an `n > 1` request that no later call continued are dropped (their outcome is
not the episode's); choice 0 is kept when none was continued. A call that sampled no token (an
empty completion) adds nothing to train: its reward goes to the nearest call that did.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agentscope_rft.explorer.agents import AgentsConfig, display_name, split_helper
from agentscope_rft.types import Call, Rollout, Sample

RewardSpread = Literal["outcome", "last_call", "each_call", "discounted"]

EPISODE_REWARD = "episode_reward"
EPISODE_SUCCESS = "episode_success"
"""`Sample.metrics` keys: the episode's reward as the workflow gave it (before any reward spread
or data operator) and whether it succeeded (1/0), so that a process that only reads the buffer
(`run.mode: train_only`) can report the episodes' rewards like an exploring run."""


@dataclass
class _Chain:
    calls: list[Call]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    call_ends: list[int] = field(default_factory=list)
    """Index of the last completion token of each call in the chain."""

    @classmethod
    def start(cls, call: Call) -> _Chain:
        chain = cls([], [], [], [])
        chain.extend(call)
        return chain

    def extend(self, call: Call) -> None:
        gap = call.prompt_ids[len(self.token_ids) :]
        self.token_ids += gap + call.completion_ids
        self.loss_mask += [0] * len(gap) + [1] * len(call.completion_ids)
        self.logprobs += [0.0] * len(gap) + list(call.logprobs)
        self.calls.append(call)
        self.call_ends.append(len(self.token_ids) - 1)

    def continued_by(self, call: Call) -> bool:
        n = len(self.token_ids)
        return len(call.prompt_ids) >= n and call.prompt_ids[:n] == self.token_ids


def _break_reason(chain: _Chain, call: Call, max_length: int | None) -> str:
    if call.temperature != chain.calls[-1].temperature:
        return "settings_changed"
    if chain.continued_by(call):
        return "max_length"
    last = chain.calls[-1]
    prefix_len = len(last.prompt_ids)
    limit = min(len(chain.token_ids), len(call.prompt_ids))
    first_diff = next((i for i in range(limit) if chain.token_ids[i] != call.prompt_ids[i]), limit)
    if first_diff < prefix_len and first_diff < len(chain.token_ids) - len(last.completion_ids):
        return "history_rewritten"
    return "completion_retokenized"


@dataclass
class TrajectoryStats:
    """Counts over built rollouts (summed across a batch by `merge`)."""

    calls: int = 0
    samples: int = 0
    merges: int = 0
    breaks: collections.Counter[str] = field(default_factory=collections.Counter)
    dropped_choices: int = 0
    untrained_calls: int = 0
    """Calls of agents that do not train (`explorer.agents`): recorded, but no sample."""
    agent_samples: collections.Counter[str] = field(default_factory=collections.Counter)
    """Samples per agent name (`-`: calls outside any agent); untrained agents count 0."""

    def merge(self, other: TrajectoryStats) -> None:
        self.calls += other.calls
        self.samples += other.samples
        self.merges += other.merges
        self.breaks.update(other.breaks)
        self.dropped_choices += other.dropped_choices
        self.untrained_calls += other.untrained_calls
        for agent, count in other.agent_samples.items():
            self.agent_samples[agent] += count

    def metrics(self) -> dict[str, float]:
        possible = self.merges + sum(self.breaks.values())
        out = {
            "trajectory/calls": float(self.calls),
            "trajectory/samples": float(self.samples),
            "trajectory/merge_rate": self.merges / possible if possible else 1.0,
            "trajectory/dropped_choices": float(self.dropped_choices),
            "trajectory/untrained_calls": float(self.untrained_calls),
        }
        if len(self.agent_samples) > 1:  # a multi-agent app: what each agent gave
            for agent, count in self.agent_samples.items():
                out[f"trajectory/samples/{agent}"] = float(count)
        for reason, count in self.breaks.items():
            out[f"trajectory/break/{reason}"] = float(count)
        return out


def _chains_for_agent(
    calls: Sequence[Call], max_length: int | None, stats: TrajectoryStats
) -> list[_Chain]:
    chains: list[_Chain] = []
    last: _Chain | None = None
    for call in calls:
        fits = [
            c
            for c in chains
            if c.continued_by(call)
            and c.calls[-1].temperature == call.temperature
            and (
                max_length is None or len(call.prompt_ids) + len(call.completion_ids) <= max_length
            )
        ]
        if fits:
            target = max(fits, key=lambda c: len(c.token_ids))
            target.extend(call)
            stats.merges += 1
            last = target
            continue
        # A call with an earlier call's very prompt samples that state again (copies of an agent
        # asked the same question, a resent request): a sibling sample, not a broken chain.
        # (The scan over earlier prompts runs only where a break would be counted.)
        if (
            last is not None
            and call.choice_index == 0
            and not any(c.prompt_ids == call.prompt_ids for ch in chains for c in ch.calls)
        ):
            stats.breaks[_break_reason(last, call, max_length)] += 1
        chain = _Chain.start(call)
        chains.append(chain)
        if call.choice_index == 0:
            last = chain
    # Drop extra choices nobody continued: only choice 0 of a request stands for the episode.
    kept = []
    for chain in chains:
        if len(chain.calls) == 1 and chain.calls[0].choice_index > 0:
            stats.dropped_choices += 1
        else:
            kept.append(chain)
    return kept


def build_samples(
    rollout: Rollout,
    *,
    group_id: str = "",
    reward_spread: RewardSpread = "outcome",
    gamma: float = 1.0,
    max_length: int | None = None,
    agents: AgentsConfig | None = None,
) -> tuple[list[Sample], TrajectoryStats]:
    """Samples of one finished episode, one or more per agent that trains (`agents`: which do;
    default every agent, without their helper calls).

    `reward_spread` says where the episode reward goes: `outcome` keeps it as each sample's
    `reward` (the advantage estimator handles it); `last_call`, `each_call` and `discounted`
    (`gamma ** calls_from_the_end`) turn it into token rewards at the end of calls instead.
    Rewards from `emit_reward` always become token rewards at the end of their call.

    Example:
        >>> samples, stats = build_samples(rollout, group_id="step3:task7")  # doctest: +SKIP
    """
    stats = TrajectoryStats(calls=len(rollout.calls))
    by_agent: dict[str | None, list[Call]] = collections.defaultdict(list)
    for call in sorted(rollout.calls, key=lambda c: (c.started_at, c.choice_index)):
        by_agent[call.agent_name].append(call)

    agents = agents or AgentsConfig()
    own_agents = [a for a in by_agent if split_helper(a)[1] is None]
    samples: list[Sample] = []
    for agent, calls in by_agent.items():
        if not agents.trains(agent):
            stats.untrained_calls += len(calls)
            stats.agent_samples[display_name(agent)] += 0
            continue
        requests = list(dict.fromkeys(c.request_id for c in calls))
        rewards = _token_rewards(rollout, agent, requests, reward_spread, gamma)
        states = _call_states(rollout, agent, requests, only_agent=len(own_agents) == 1)
        calls = _without_empty_completions(calls, rewards)
        chains = _chains_for_agent(calls, max_length, stats)
        stats.agent_samples[display_name(agent)] += len(chains)
        for k, chain in enumerate(chains):
            token_rewards = [0.0] * len(chain.token_ids)
            for call, end in zip(chain.calls, chain.call_ends, strict=True):
                token_rewards[end] += rewards.get(call.request_id, 0.0)
            outcome = rollout.reward if reward_spread == "outcome" else 0.0
            samples.append(
                Sample(
                    token_ids=chain.token_ids,
                    loss_mask=chain.loss_mask,
                    logprobs=chain.logprobs,
                    reward=outcome,
                    rollout_id=rollout.rollout_id,
                    task_id=rollout.task_id,
                    group_id=group_id,
                    policy_version=min(c.policy_version for c in chain.calls),
                    agent_name=agent,
                    stop_reason=chain.calls[-1].finish_reason,
                    temperature=chain.calls[0].temperature,
                    token_rewards=token_rewards if any(token_rewards) else None,
                    num_calls=len(chain.calls),
                    step_states=(
                        [states.get(c.request_id, "") for c in chain.calls] if states else None
                    ),
                    sample_id=f"{rollout.rollout_id}:{agent or '-'}:{k}",
                    metrics={
                        EPISODE_REWARD: rollout.reward,
                        EPISODE_SUCCESS: float(rollout.success),
                    },
                )
            )
    stats.samples = len(samples)
    return samples, stats


def _without_empty_completions(calls: list[Call], rewards: dict[str, float]) -> list[Call]:
    """The calls that sampled a token; the reward of a request none of whose calls did moves to
    the nearest request before it that did (else after it), as no token of its own can carry it.

    Its prompt stays in the samples: the next call's prompt extends it.
    """
    sampled = [c for c in calls if c.completion_ids]
    order = list(dict.fromkeys(c.request_id for c in calls))
    carriers = list(dict.fromkeys(c.request_id for c in sampled))
    if not carriers:
        return sampled
    for position, request in enumerate(order):
        if request in carriers or not rewards.get(request):
            continue
        before = [r for r in order[:position] if r in carriers]
        target = before[-1] if before else next(r for r in order[position:] if r in carriers)
        rewards[target] += rewards.pop(request)
    return sampled


def _call_states(
    rollout: Rollout, agent: str | None, requests: list[str], only_agent: bool
) -> dict[str, str]:
    """Anchor state per request id of this agent, from `emit_state` (an untagged state belongs to
    the episode's only agent)."""
    out: dict[str, str] = {}
    for state in rollout.step_states:
        mine = state.agent_name == agent or (state.agent_name is None and only_agent)
        if mine and state.call_index < len(requests):
            out[requests[state.call_index]] = state.key
    return out


def _token_rewards(
    rollout: Rollout,
    agent: str | None,
    requests: list[str],
    spread: RewardSpread,
    gamma: float,
) -> dict[str, float]:
    """Reward per request id of this agent: emitted step rewards plus the spread outcome."""
    out: dict[str, float] = collections.defaultdict(float)
    if not requests:
        return out
    for step in rollout.step_rewards:
        if step.agent_name == agent:
            out[requests[min(step.call_index, len(requests) - 1)]] += step.value
    if spread == "last_call":
        out[requests[-1]] += rollout.reward
    elif spread == "each_call":
        for request in requests:
            out[request] += rollout.reward
    elif spread == "discounted":
        for k, request in enumerate(requests):
            out[request] += rollout.reward * gamma ** (len(requests) - 1 - k)
    return out


def episode_reward_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """`reward/mean`, `reward/std`, `reward/min`, `reward/max` and `success_rate` over the
    episodes whose samples these are, as an exploring step logs them for its episodes: one value
    per rollout, the workflow's reward (`EPISODE_REWARD`, else the sample's `reward`). Only
    policy samples (`kind: rl`) count; `success_rate` needs `EPISODE_SUCCESS` on every episode
    (samples written before it existed have none). Empty when there is no policy sample.

    Example:
        >>> make = lambda r, rid: Sample([1, 2], [0, 1], [0.0, -1.0], r, rid, "t",
        ...                              metrics={EPISODE_REWARD: r, EPISODE_SUCCESS: r})
        >>> m = episode_reward_metrics([make(1.0, "a"), make(1.0, "a"), make(0.0, "b")])
        >>> m["reward/mean"], m["reward/std"], m["success_rate"]
        (0.5, 0.5, 0.5)
    """
    episodes: dict[str, Sample] = {}
    for sample in samples:
        if sample.kind == "rl":
            episodes.setdefault(sample.rollout_id, sample)
    if not episodes:
        return {}
    rewards = [float(s.metrics.get(EPISODE_REWARD, s.reward)) for s in episodes.values()]
    mean = sum(rewards) / len(rewards)
    out = {
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "reward/min": min(rewards),
        "reward/max": max(rewards),
    }
    successes = [s.metrics.get(EPISODE_SUCCESS) for s in episodes.values()]
    if all(v is not None for v in successes):
        out["success_rate"] = sum(float(v or 0.0) for v in successes) / len(successes)
    return out
