"""AlgorithmConfig: short YAML, unknown names and keys, custom functions by import path."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from agentscope_rft.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    AlgorithmConfig,
    LossInputs,
    compute_advantages,
    policy_objective,
)


@pytest.fixture(autouse=True)
def _custom_module_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _load(text: str) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate(yaml.safe_load(text)["algorithm"])


def test_short_yaml_forms() -> None:
    cfg = _load("algorithm: {advantage: {type: rloo}}")
    assert cfg.advantage.type == "rloo" and cfg.objective == "rl"
    cfg = _load("algorithm: {advantage: grpo, policy_loss: {type: gspo}}")
    assert cfg.policy_loss.type == "gspo"
    assert cfg.policy_loss.clip_low == pytest.approx(3e-4)  # type: ignore[attr-defined]
    cfg = _load("algorithm: {objective: dpo, dpo: {beta: 0.2}}")
    assert cfg.dpo.beta == 0.2 and cfg.needs_reference() and not cfg.needs_critic()
    cfg = _load(
        "algorithm: {advantage: {type: gae, lam: 0.95}, kl: {coef: 0.01, apply_to: reward}}"
    )
    assert cfg.needs_critic() and cfg.needs_reference() and cfg.kl is not None


def test_resolved_config_round_trips_with_all_fields() -> None:
    cfg = _load("algorithm: {advantage: {type: stepwise, gamma: 0.9}, policy_loss: cispo}")
    dumped = cfg.model_dump()
    assert dumped["advantage"] == {
        "type": "stepwise",
        "gamma": 0.9,
        "normalize_std": True,
        "epsilon": 1e-6,
    }
    assert dumped["policy_loss"]["clip_high"] == 4.0
    assert AlgorithmConfig.model_validate(dumped) == cfg


@pytest.mark.parametrize(
    ("algorithm", "message"),
    [
        ({"advantage": "rlo"}, "unknown advantage estimator 'rlo' (did you mean 'rloo'?); known: "),
        ({"policy_loss": {"type": "gpso"}}, "did you mean 'gspo'?"),
        ({"objective": "dpoo"}, "unknown objective 'dpoo' (did you mean 'dpo'?)"),
        ({"loss_agg": "token_mean"}, "did you mean 'token-mean'?"),
        ({"kl": {"estimator": "k4"}}, "unknown KL estimator 'k4'"),
        ({"advantage": {"type": "grpo", "normalise_std": False}}, "did you mean 'normalize_std'?"),
        ({"entropy_cof": 0.1}, "did you mean 'entropy_coef'?"),
        ({"advantage": {"gamma": 0.9}}, "advantage estimator needs a `type`"),
        ({"policy_loss": {"type": "ppo", "clip_low": 1.5}}, "less than 1"),
        ({"loss_agg": "seq-mean-token-sum-norm"}, "needs loss_agg_horizon"),
        ({"loss_agg_horizon": 512}, "but loss_agg is 'token-mean': set loss_agg: seq-mean-"),
        ({"sft_mix": {"mu_peak": 0.1, "mu_valley": 0.5}}, "must be <= mu_peak"),
    ],
)
def test_bad_configs_fail_with_clear_messages(algorithm: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        AlgorithmConfig.model_validate(algorithm)
    assert message in str(excinfo.value)


def test_registry_pairs_each_function_with_its_config_class() -> None:
    for table in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES):
        for name, entry in table.items():
            params = list(inspect.signature(entry.fn).parameters)
            hints = typing.get_type_hints(entry.fn)
            assert hints[params[1]] is entry.config, name
            assert entry.config.model_fields["type"].default == name
            for field_name, field in entry.config.model_fields.items():
                assert field.description or field_name == "type", (name, field_name)
    for field_name, field in AlgorithmConfig.model_fields.items():
        assert field.description, field_name


def test_custom_advantage_by_import_path() -> None:
    cfg = _load(
        "algorithm:\n"
        "  advantage: {type: custom, path: 'my_custom_algos:scaled_reward', args: {scale: 2.0}}\n"
    )
    out = compute_advantages(
        AdvantageInputs(
            rewards=torch.tensor([1.0, -0.5]),
            group_ids=torch.tensor([0, 0]),
            episode_ids=torch.tensor([0, 1]),
            loss_mask=torch.tensor([[0, 1], [1, 1]]),
        ),
        cfg,
    )
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 2.0], [-1.0, -1.0]]))
    assert out.metrics["custom/scale"] == 2.0
    assert not cfg.drops_zero_variance_groups()  # no group baseline unless the user says so


def test_custom_policy_loss_by_import_path() -> None:
    cfg = _load(
        "algorithm:\n  policy_loss: {type: custom, path: 'my_custom_algos:vanilla_reinforce'}\n"
    )
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, metrics = policy_objective(
        LossInputs(
            logprobs=lp,
            old_logprobs=lp.detach(),
            rollout_logprobs=lp.detach(),
            advantages=torch.tensor([[1.0, 0.5]]),
            loss_mask=torch.tensor([[1, 1]]),
            global_num_tokens=2,
            global_num_seqs=1,
        ),
        cfg,
        step=0,
    )
    assert float(loss.detach()) == pytest.approx((1.0 * -1.0 + 0.5 * -2.0) / 2 * -1)  # 1.0
    assert metrics["actor/logprob"] == pytest.approx(-1.5)


@pytest.mark.parametrize(
    ("path", "args", "message"),
    [
        ("my_custom_algos.scaled_reward", {}, "must look like 'package.module:function'"),
        ("no_such_module_xyz:fn", {}, "cannot import module 'no_such_module_xyz'"),
        ("no_such_module_xyz:fn", {}, "give its path instead, e.g. 'no_such_module_xyz.py:fn'"),
        ("no/such_file.py:fn", {}, "file no/such_file.py does not exist"),
        ("my_custom_algos:missing", {}, "has no attribute 'missing'"),
        ("my_custom_algos:NOT_CALLABLE", {}, "is not callable"),
        ("my_custom_algos:one_parameter", {}, "takes (inputs); it must be `def fn(inputs"),
        ("my_custom_algos:unannotated_cfg", {}, "must be annotated with a pydantic BaseModel"),
        ("my_custom_algos:wrong_inputs", {}, "its first parameter 'inputs' is annotated"),
        ("my_custom_algos:wrong_return", {}, "return annotation"),
        ("my_custom_algos:async_loss", {}, "is async; it must be `def fn(inputs"),
        ("my_custom_algos:scaled_reward", {"scale": -1}, "args do not validate"),
        ("my_custom_algos:scaled_reward", {"scael": 2}, "args do not validate"),
    ],
)
def test_custom_function_that_does_not_fit_fails_at_load(
    path: str, args: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError) as excinfo:
        AlgorithmConfig.model_validate(
            {"advantage": {"type": "custom", "path": path, "args": args}}
        )
    assert message in str(excinfo.value)
    assert path in str(excinfo.value)


def test_custom_advantage_returning_the_wrong_type_fails_clearly() -> None:
    cfg = AlgorithmConfig.model_validate(
        {"advantage": {"type": "custom", "path": "my_custom_algos:returns_tensor"}}
    )
    inputs = AdvantageInputs(
        torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0]), torch.tensor([[1]])
    )
    with pytest.raises(TypeError, match="not AdvantageOutputs"):
        compute_advantages(inputs, cfg)


def _group_of_two() -> AdvantageInputs:
    return AdvantageInputs(
        rewards=torch.tensor([1.0, 1.0]),
        group_ids=torch.tensor([0, 0]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[0, 1, 1], [0, 1, 0]]),
    )


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        ("nan_advantages", ValueError, "returned advantages with 3 non-finite (NaN or inf) values"),
        ("list_advantages", TypeError, "returned advantages of type list, not a Tensor"),
    ],
)
def test_custom_advantage_returning_bad_values_fails_naming_it(
    fn: str, error: type[Exception], message: str
) -> None:
    path = f"my_custom_algos:{fn}"
    cfg = AlgorithmConfig.model_validate({"advantage": {"type": "custom", "path": path}})
    with pytest.raises(error) as excinfo:
        compute_advantages(_group_of_two(), cfg)
    assert f"custom advantage {path!r}" in str(excinfo.value)
    assert message in str(excinfo.value)


def test_custom_advantage_that_needs_a_critic_must_return_its_targets() -> None:
    path = "my_custom_algos:scaled_reward"  # returns=None
    cfg = AlgorithmConfig.model_validate(
        {"advantage": {"type": "custom", "path": path, "needs_critic": True}}
    )
    assert cfg.needs_critic()
    inputs = dataclasses.replace(_group_of_two(), values=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="needs_critic: true but returned no returns"):
        compute_advantages(inputs, cfg)


def test_custom_advantage_may_return_integers() -> None:
    cfg = AlgorithmConfig.model_validate(
        {"advantage": {"type": "custom", "path": "my_custom_algos:integer_advantages"}}
    )
    out = compute_advantages(_group_of_two(), cfg)
    assert out.advantages.dtype == torch.float32
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]))


def _loss_inputs() -> LossInputs:
    lp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    return LossInputs(
        logprobs=lp,
        old_logprobs=lp.detach(),
        rollout_logprobs=lp.detach(),
        advantages=torch.tensor([[1.0, 0.5, 0.0]]),
        loss_mask=torch.tensor([[1, 1, 0]]),
        global_num_tokens=2,
        global_num_seqs=1,
    )


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        ("nan_loss", ValueError, "returned a loss with 2 non-finite (NaN or inf) values"),
        ("constant_loss", ValueError, "returned a loss without a gradient"),
        ("scalar_metric", ValueError, "metric 'logprob' of shape (); expected the per-token"),
        ("raising_loss", RuntimeError, "raised KeyError: 'advantage_scale'"),
    ],
)
def test_custom_policy_loss_returning_bad_values_fails_naming_it(
    fn: str, error: type[Exception], message: str
) -> None:
    path = f"my_custom_algos:{fn}"
    cfg = AlgorithmConfig.model_validate({"policy_loss": {"type": "custom", "path": path}})
    with pytest.raises(error) as excinfo:
        policy_objective(_loss_inputs(), cfg, step=0)
    assert f"custom policy loss {path!r}" in str(excinfo.value)
    assert message in str(excinfo.value)


def test_docs_list_every_algorithm() -> None:
    from agentscope_rft.algorithms import AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES

    docs = (Path(__file__).resolve().parents[3] / "docs" / "algorithms.md").read_text()
    names = [*ADVANTAGE_ESTIMATORS, *POLICY_LOSSES, *OBJECTIVES, *AGGREGATIONS, *KL_ESTIMATORS]
    missing = [name for name in names if f"`{name}`" not in docs and f": {name}" not in docs]
    assert not missing, f"docs/algorithms.md does not mention {missing}"
    for field_name in AlgorithmConfig.model_fields:
        assert f"`{field_name}`" in docs, field_name


def test_custom_file_path_given_with_set_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_rft.config import load_config

    source = Path(__file__).parent / "my_custom_algos.py"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "algos.py").write_text(source.read_text())
    monkeypatch.chdir(tmp_path)
    config = load_config(
        None,
        [
            "workflow=app.py:run",
            "tasks.train=tasks.jsonl",
            "algorithm.policy_loss.type=custom",
            "algorithm.policy_loss.path=mine/algos.py:vanilla_reinforce",
        ],
    )
    loss = config.algorithm.policy_loss
    assert loss.path == f"{tmp_path / 'mine' / 'algos.py'}:vanilla_reinforce"  # saved absolute
    assert loss._fn.__name__ == "vanilla_reinforce"
