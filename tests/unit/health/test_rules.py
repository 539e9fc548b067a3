"""Health rules against hand-derived histories, and the watcher's bookkeeping."""

import dataclasses
import json
import math
import re

import pytest
import yaml

from agentscope_rft.config import ConfigError, load_config
from agentscope_rft.health.config import (
    EntropyCollapseRule,
    EqualRewardRule,
    HealthConfig,
    KLRule,
    LogprobGapRule,
    NonFiniteRule,
    RewardCollapseRule,
    TruncationRule,
)
from agentscope_rft.health.rollback import RollbackState
from agentscope_rft.health.rules import (
    StepMetrics,
    entropy_collapse,
    equal_rewards,
    kl,
    logprob_gap,
    non_finite,
    reward_collapse,
    truncation,
)
from agentscope_rft.health.watcher import HealthWatcher, health_metrics, read_events, strongest


def steps(name: str, values: list[float]) -> list[StepMetrics]:
    return [StepMetrics(i, {name: v}) for i, v in enumerate(values)]


def test_entropy_collapse_fires_after_patience_with_the_streaks_onset():
    cfg = EntropyCollapseRule(fraction=0.25, baseline_steps=2, patience=2)
    # baseline (2.0 + 1.0) / 2 = 1.5, bound 0.375
    history = steps("entropy/mean", [2.0, 1.0, 0.5, 0.3])
    assert entropy_collapse(history, cfg) is None  # one step below the bound: patience 2
    history = steps("entropy/mean", [2.0, 1.0, 0.5, 0.3, 0.2, 0.1])
    finding = entropy_collapse(history, cfg)
    assert finding is not None
    assert finding.onset == 3 and finding.value == 0.1
    assert finding.threshold == pytest.approx(0.375)
    # not enough steps for a baseline and a later step
    assert entropy_collapse(steps("entropy/mean", [2.0, 0.0]), cfg) is None


def test_a_recovered_streak_does_not_count():
    cfg = EntropyCollapseRule(fraction=0.5, baseline_steps=1, patience=2)
    history = steps("entropy/mean", [1.0, 0.4, 0.9, 0.4])
    assert entropy_collapse(history, cfg) is None
    history.append(StepMetrics(4, {"entropy/mean": 0.3}))
    assert entropy_collapse(history, cfg).onset == 3


def test_entropy_falling_on_solved_tasks_is_convergence_not_a_collapse():
    # The inventory app's seed 0 (2026-11-27): after the SFT warm start the entropy fell from
    # 0.58 to 0.05 while the sampled success rose to 0.91 and validation reached 1.0; rolling
    # back undid the learning. Steps that succeed >= converged_success do not break the rule.
    cfg = EntropyCollapseRule(fraction=0.2, baseline_steps=1, patience=2)
    entropy = [0.58, 0.35, 0.11, 0.05]
    success = [0.5, 0.56, 0.78, 0.91]

    def history(successes: list[float]) -> list[StepMetrics]:
        return [
            StepMetrics(i, {"entropy/mean": e, "success_rate": s})
            for i, (e, s) in enumerate(zip(entropy, successes, strict=True))
        ]

    assert entropy_collapse(history(success), cfg) is None  # step 3 solved: no 2-step streak
    # the same entropy on failing episodes is a collapse, with the streak's onset
    finding = entropy_collapse(history([0.5, 0.4, 0.2, 0.1]), cfg)
    assert finding is not None and finding.onset == 2
    # a solved step in the middle breaks the streak; two failing steps after it fire again
    more = [*history(success), StepMetrics(4, {"entropy/mean": 0.04, "success_rate": 0.3})]
    assert entropy_collapse(more, cfg) is None
    more.append(StepMetrics(5, {"entropy/mean": 0.04, "success_rate": 0.2}))
    assert entropy_collapse(more, cfg).onset == 4
    # converged_success: null -> entropy alone decides; the bound is inclusive
    assert entropy_collapse(history(success), cfg.model_copy(update={"converged_success": None}))
    at_bound = history([0.5, 0.9, 0.9, 0.9])
    assert entropy_collapse(at_bound, cfg) is None
    assert entropy_collapse(at_bound, cfg.model_copy(update={"converged_success": 0.95}))


def test_bounds_rules_fire_above_their_bound_only():
    gap = steps("train/rollout_trainer_logprob_diff", [0.01, 0.2, 0.3])
    assert logprob_gap(gap, LogprobGapRule(max=0.1, patience=2)).onset == 1
    assert logprob_gap(gap, LogprobGapRule(max=0.25, patience=2)) is None
    clip = steps("response_length/clip_ratio", [0.6, 0.7, 0.9])
    assert truncation(clip, TruncationRule(max_rate=0.5, patience=3)).onset == 0
    assert kl(steps("kl/mean", [0.1, 2.0]), KLRule(max=1.0, patience=1)).value == 2.0
    assert kl(steps("other", [5.0]), KLRule(max=1.0, patience=1)) is None  # not logged


def test_equal_reward_share_prefers_dynamic_samplings_count():
    cfg = EqualRewardRule(max_share=0.7, patience=1)
    trainer_only = [StepMetrics(0, {"train/groups": 4.0, "train/zero_variance_groups": 3.0})]
    assert equal_rewards(trainer_only, cfg).value == 0.75
    dynamic = [
        StepMetrics(
            0,
            {
                "explore/tasks": 12.0,
                "explore/groups_equal_reward": 6.0,  # 50%: what the explorer saw
                "train/groups": 4.0,
                "train/zero_variance_groups": 4.0,
            },
        )
    ]
    assert equal_rewards(dynamic, cfg) is None


def test_non_finite_catches_nan_metrics_and_skipped_updates():
    assert non_finite(steps("loss", [0.1, math.inf]), NonFiniteRule()).metric == "loss"
    marked = [StepMetrics(0, {"train/non_finite": 1.0, "loss": 0.0})]
    assert non_finite(marked, NonFiniteRule()).metric == "train/non_finite"
    assert non_finite(steps("loss", [0.1]), NonFiniteRule()) is None


def test_reward_collapse_needs_something_learned_first():
    cfg = RewardCollapseRule(window=2, drop=0.5, min_best=0.1)
    assert reward_collapse(steps("reward/mean", [0.0, 0.05, 0.0, 0.0]), cfg) is None
    finding = reward_collapse(steps("reward/mean", [0.2, 0.8, 0.8, 0.8, 0.0, 0.0]), cfg)
    # averages: .5 .8 .8 .4 .0 -> best .8, bound .4; .4 is not below it, .0 is (step 5);
    # the first step in that window whose reward fell under the bound is step 4.
    assert finding is not None and finding.onset == 4
    assert finding.threshold == pytest.approx(0.4)


def test_watcher_fires_once_per_streak_and_marks_suspect_steps(tmp_path):
    config = HealthConfig.model_validate(
        {
            "rules": {
                "entropy_collapse": {
                    "fraction": 0.5,
                    "baseline_steps": 1,
                    "patience": 2,
                    "action": "stop",
                }
            }
        }
    )
    watcher = HealthWatcher(config, tmp_path)
    assert watcher.observe(0, {"entropy/mean": 1.0}) == []
    assert watcher.observe(1, {"entropy/mean": 0.4}) == []  # the streak starts...
    assert not watcher.healthy(1) and watcher.healthy(0)  # ...and is suspect already
    assert not watcher.healthy(2)  # not watched yet
    [event] = watcher.observe(2, {"entropy/mean": 0.3})
    assert (event.rule, event.action, event.onset, event.step) == ("entropy_collapse", "stop", 1, 2)
    assert watcher.observe(3, {"entropy/mean": 0.2}) == []  # said once
    assert watcher.observe(4, {"entropy/mean": 0.9}) == []  # recovered
    assert watcher.observe(5, {"entropy/mean": 0.1}) == []
    assert [e.onset for e in watcher.observe(6, {"entropy/mean": 0.1})] == [5]
    watcher.record(event)
    assert read_events(tmp_path) == [event]
    assert json.loads((tmp_path / "health.jsonl").read_text())["rule"] == "entropy_collapse"
    watcher.rewind(1, 0)
    assert read_events(tmp_path) == []  # step 2 is redone: its event goes
    assert watcher.healthy(0) and not watcher.healthy(1)
    assert [h.step for h in watcher.history] == [0]


def test_a_warm_start_is_not_a_collapse_but_a_nan_in_it_is_caught(tmp_path):
    # Steps 0-3 are SFT on demonstrations (offline.warmup_steps: 4): entropy falls by design.
    config = HealthConfig.model_validate(
        {"rules": {"entropy_collapse": {"patience": 1, "action": "rollback"}}}
    )
    watcher = HealthWatcher(config, tmp_path, policy_from=4)
    for step, entropy in enumerate([1.5, 0.6, 0.1, 0.05]):
        assert watcher.observe(step, {"entropy/mean": entropy}) == []
    # the RL steps' own start is the baseline: 0.05 -> 0.04 is no collapse, 0.005 is
    assert watcher.observe(4, {"entropy/mean": 0.05}) == []
    assert watcher.observe(5, {"entropy/mean": 0.04}) == []
    [event] = watcher.observe(6, {"entropy/mean": 0.005})
    assert (event.rule, event.onset) == ("entropy_collapse", 6)
    # without the warm start marked, the SFT steps read as a collapse
    unmarked = HealthWatcher(config, tmp_path / "unmarked")
    events = [unmarked.observe(s, {"entropy/mean": e}) for s, e in enumerate([1.5, 0.6, 0.1])]
    assert [e.rule for e in events[-1]] == ["entropy_collapse"]
    # a NaN during the warm start still stops the run
    [nan] = HealthWatcher(config, tmp_path / "nan", policy_from=4).observe(1, {"loss": math.nan})
    assert (nan.rule, nan.action) == ("non_finite", "stop")


def test_health_metrics_and_the_strongest_action(tmp_path):
    config = HealthConfig.model_validate(
        {
            "rules": {
                "kl": {"max": 0.5, "patience": 1, "action": "rollback"},
                "truncation": {"max_rate": 0.5, "patience": 1},
            }
        }
    )
    events = HealthWatcher(config, tmp_path).observe(
        0, {"kl/mean": 1.0, "response_length/clip_ratio": 0.9}
    )
    assert health_metrics(events) == {
        "health/truncation": 1.0,
        "health/kl": 3.0,
        "health/events": 2.0,
    }
    assert strongest(events).rule == "kl"
    assert strongest([e for e in events if e.rule == "truncation"]) is None  # a warning


def test_a_users_rule_that_raises_is_ignored_and_bad_paths_fail_early(tmp_path):
    module = tmp_path / "my_rules.py"
    module.write_text("def boom(history, params):\n    raise KeyError('x')\n")
    config = HealthConfig.model_validate({"custom": [{"path": f"{module}:boom"}]})
    assert HealthWatcher(config, tmp_path).observe(0, {"loss": 1.0}) == []
    from agentscope_rft.api import WorkflowError

    with pytest.raises(WorkflowError, match="has no 'nope'"):
        HealthWatcher(
            HealthConfig.model_validate({"custom": [{"path": f"{module}:nope"}]}), tmp_path
        )


def test_rollback_state_compounds_and_changes_the_algorithm():
    from agentscope_rft.algorithms.config import AlgorithmConfig
    from agentscope_rft.health.config import RollbackSettings

    settings = RollbackSettings(lr_factor=0.5, kl_coef=0.01, entropy_coef=0.001)
    state = RollbackState().after(settings).after(settings)
    assert state.rollbacks == 2 and state.lr_scale == 0.25
    algorithm = state.algorithm(AlgorithmConfig())
    assert algorithm.kl is not None and algorithm.kl.coef == 0.01
    assert algorithm.entropy_coef == 0.001
    assert RollbackState.from_dict(state.to_dict()) == state


def test_config_refuses_what_it_cannot_do(tmp_path):
    base = ["workflow=app.py:run", "tasks.train=t.jsonl"]
    with pytest.raises(ConfigError, match="must be a validation metric"):
        load_config(None, [*base, "run.best_metric=reward/mean"])
    with pytest.raises(ConfigError, match="torch trainer only"):
        load_config(
            None,
            [*base, "trainer.type=verl", "health.rules.entropy_collapse.action=rollback"],
        )
    with pytest.raises(ConfigError, match="unknown EntropyCollapseRule key 'fractoin'"):
        load_config(None, [*base, "health.rules.entropy_collapse.fractoin=0.1"])
    both = tmp_path / "both.yaml"
    both.write_text("workflow: app.py:run\ntasks: {train: t.jsonl, test: a.jsonl, eval: b.jsonl}\n")
    with pytest.raises(ConfigError, match="name the same split"):
        load_config(both)
    # an override of a split replaces the file's key for it under its other name
    both.write_text("workflow: app.py:run\ntasks: {train: t.jsonl, test: a.jsonl}\n")
    assert load_config(both, ["tasks.eval=null"]).tasks.eval is None
    assert load_config(both, ["tasks.eval=b.jsonl"]).tasks.eval.endswith("b.jsonl")
    config = load_config(None, [*base, "tasks.validation=v.jsonl", "tasks.test=x.jsonl"])
    assert config.tasks.val.endswith("v.jsonl") and config.tasks.eval.endswith("x.jsonl")


def test_a_bare_off_in_yaml_turns_a_rule_off(tmp_path):
    """YAML reads `action: off` as false; it means `off`, as the docs write it (file and --set)."""
    from agentscope_rft.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text(
        "workflow: app.py:run\ntasks: {train: t.jsonl}\n"
        "health:\n  rules:\n    kl: {action: off}\n    non_finite: {action: off}\n"
        "  custom: [{path: my_rules:fn, action: off}]\n"
    )
    config = load_config(path, ["health.rules.entropy_collapse.action=off"])
    rules = config.health.rules
    assert rules.kl.action == rules.non_finite.action == rules.entropy_collapse.action == "off"
    assert config.health.custom[0].action == "off"
    assert "kl" not in dict(config.health.named_rules())


def test_a_bad_custom_rule_is_refused_before_anything_loads(tmp_path):
    from agentscope_rft.runtime.preflight import preflight

    module = tmp_path / "my_rules.py"
    module.write_text("LIMIT = 3\n\ndef fine(history, params):\n    return None\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t0", "prompt": "hi"}\n')
    base = [
        "workflow=tests/integration/toy_app.py:run",
        f"tasks.train={tasks}",
        "model.name_or_path=/not/loaded/before/the/rules",
    ]
    for path, fragment in [
        (str(module), "must be `package.module:function`"),
        (f"{tmp_path / 'none.py'}:fine", "does not exist"),
        (f"{module}:nope", "has no 'nope'"),
        (f"{module}:LIMIT", "is not callable"),
    ]:
        custom = json.dumps([{"path": path, "action": "warn"}])
        config = load_config(None, [*base, f"health.custom={custom}"])
        with pytest.raises(ConfigError, match=f"health.custom: .*{re.escape(fragment)}"):
            preflight(config)


@pytest.mark.parametrize(
    "custom",
    [
        [{"path": "my_rules.py:kl"}],
        [{"path": "a.py:check"}, {"path": "b.py:check"}],
        [{"path": "a.py:one", "name": "x"}, {"path": "b.py:two", "name": "x"}],
    ],
)
def test_two_rules_of_one_name_are_refused(tmp_path, custom):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}, "health": {"custom": custom}}
        )
    )
    with pytest.raises(ConfigError, match=r"health.custom: .* give it its own `name:`"):
        load_config(config)
    renamed = [{**rule, "name": f"mine{i}"} for i, rule in enumerate(custom)]
    assert HealthConfig.model_validate({"custom": renamed}).named_rules()[-1][0] == "mine" + str(
        len(custom) - 1
    )


def test_a_users_rule_is_not_called_before_the_first_rl_step(tmp_path, caplog):
    # A rule reads `history[-1]`, as the documented example does: the warm start's SFT steps
    # (and every step of an offline run) leave it nothing to judge, not an IndexError a step.
    module = tmp_path / "my_rules.py"
    module.write_text(
        "def last_loss(history, params):\n"
        "    assert history, 'called with no step'\n"
        "    return None\n"
    )
    config = HealthConfig.model_validate({"custom": [{"path": f"{module}:last_loss"}]})
    watcher = HealthWatcher(config, tmp_path, policy_from=2)
    for step in range(4):
        assert watcher.observe(step, {"loss": 1.0}) == []
    assert "raised" not in caplog.text


def test_pruning_keeps_a_checkpoint_before_the_one_a_rollback_restores(tmp_path):
    from agentscope_rft.runtime.best import RUN_STATE_FILE
    from agentscope_rft.runtime.components import checkpoint_dir, rollback_targets

    for step in range(7):
        checkpoint_dir(tmp_path, step).mkdir(parents=True)
        (checkpoint_dir(tmp_path, step) / RUN_STATE_FILE).write_text("{}")
    healthy = lambda step: step != 5  # noqa: E731
    # the newest healthy (6) and the one before it: the problem may show from step 6 on
    assert rollback_targets(tmp_path, 7, None, healthy) == {6, 4}
    # after a rollback to step 2: the one before 2 too (the problem found again from there)
    assert rollback_targets(tmp_path, 7, 2, healthy) == {6, 4, 1}
    from agentscope_rft.health.config import RollbackSettings

    state = RollbackState().after(RollbackSettings(), 2)
    assert RollbackState.from_dict(state.to_dict()).restored == 2


def test_a_resume_keeps_the_events_of_the_steps_that_stand(tmp_path):
    """health.jsonl was not cut at resume: a run killed between an event and its step's
    checkpoint recorded the event again when it redid the step (two marks on the curves)."""
    from agentscope_rft.health.watcher import HealthEvent

    def event(step, rule, action, onset, to=None):
        return HealthEvent(step, 0.0, rule, action, "m", 1.0, 0.5, "why", onset, to)

    run = [
        event(1, "truncation", "warn", 1),
        event(4, "kl", "rollback", 3, to=2),  # went back to step 2: steps 2-4 were redone
        event(2, "kl", "stop", 2),  # stopped (saved after step 3), resumed
        event(3, "truncation", "warn", 3),  # killed before step 4 was saved
        event(4, "kl", "rollback", 4, to=3),  # killed before this rollback was saved
    ]
    (tmp_path / "health.jsonl").write_text(
        "".join(json.dumps(dataclasses.asdict(e)) + "\n" for e in run) + '{"step": 5, "ru'
    )
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "phase": "train", "response_length/clip_ratio": c}) + "\n"
            for s, c in enumerate([0.1, 0.9, 0.9])
        )
    )
    config = HealthConfig.model_validate(
        {"rules": {"truncation": {"max_rate": 0.5, "patience": 1}}}
    )
    watcher = HealthWatcher(config, tmp_path, resumed=(3, 1))  # state.json: step 3, 1 rollback
    assert read_events(tmp_path) == run[:3]
    assert [h.step for h in watcher.history] == [0, 1, 2]
    # the stop's streak marks its step; the warning said at step 1 is not said again
    assert not watcher.healthy(2) and watcher.healthy(1)
    assert watcher.observe(3, {"response_length/clip_ratio": 0.9}) == []


def test_a_dead_policy_is_caught_and_a_moving_or_signal_free_one_is_not():
    from agentscope_rft.health.config import DeadPolicyRule
    from agentscope_rft.health.rules import dead_policy

    # measured at trainer.lr 1e6 on the tiny model: grad 0 from step 1, entropy at its maximum
    dead = {"grad_norm": 0.0, "train/trained_tokens": 64.0, "entropy/mean": 10.80}
    dead |= {"advantage/num_groups": 2.0, "advantage/zero_variance_groups": 0.0}
    steps = [StepMetrics(0, {**dead, "grad_norm": 1.41})]
    steps += [StepMetrics(s, dead) for s in range(1, 4)]
    finding = dead_policy(steps, DeadPolicyRule())
    assert finding is not None and finding.onset == 1 and "trainer.lr" in finding.message
    assert dead_policy(steps[:3], DeadPolicyRule()) is None  # 2 steps: not yet
    # a healthy quickstart-like run: small but non-zero gradients
    moving = [StepMetrics(s, {**dead, "grad_norm": 1e-4 * (s + 1)}) for s in range(8)]
    assert dead_policy(moving, DeadPolicyRule()) is None
    # every group's rewards equal (filtering off): no signal, a zero gradient is expected
    flat = {**dead, "advantage/zero_variance_groups": 2.0}
    assert dead_policy([StepMetrics(s, flat) for s in range(4)], DeadPolicyRule()) is None
    # a skipped step, or no trained tokens, says nothing
    skipped = {**dead, "train/skipped": 1.0}
    assert dead_policy([StepMetrics(s, skipped) for s in range(4)], DeadPolicyRule()) is None
    # by the explorer's count when the trainer logs no advantage groups
    other = {"grad_norm": 0.0, "train/trained_tokens": 8.0, "explore/tasks": 4.0}
    other |= {"explore/groups_equal_reward": 1.0}
    assert dead_policy([StepMetrics(s, other) for s in range(3)], DeadPolicyRule()) is not None
    assert HealthConfig().rules.dead_policy.action == "stop"


def test_a_resume_keeps_the_marks_of_a_streak_that_had_not_fired(tmp_path):
    """A rule (patience 3) broken at steps 1 and 2, then a kill and a resume after step 3 whose
    step 3 is fine: the resumed run took steps 1 and 2 for healthy checkpoints (a rollback
    could go back to them), as only the events of `health.jsonl` were rebuilt."""
    config = HealthConfig.model_validate(
        {"rules": {"truncation": {"max_rate": 0.5, "patience": 3, "action": "rollback"}}}
    )
    clips = [0.1, 0.9, 0.9, 0.1]
    watcher = HealthWatcher(config, tmp_path)
    for step, clip in enumerate(clips):
        assert watcher.observe(step, {"response_length/clip_ratio": clip}) == []
    assert [watcher.healthy(s) for s in range(4)] == [True, False, False, True]
    saved = json.loads(json.dumps(watcher.marks()))  # (as the run state holds them)
    assert saved == [[1, 2]]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "phase": "train", "response_length/clip_ratio": c}) + "\n"
            for s, c in enumerate(clips)
        )
    )
    resumed = HealthWatcher(config, tmp_path, resumed=(4, 0), marked=saved)
    assert [resumed.healthy(s) for s in range(4)] == [True, False, False, True]
    # a resume from an earlier checkpoint keeps the marks of the steps before it only
    earlier = HealthWatcher(config, tmp_path, resumed=(2, 0), marked=saved)
    assert [earlier.healthy(s) for s in range(2)] == [True, False] and earlier.marks() == [[1, 1]]
