"""User-defined advantage estimators and policy losses, referenced by import path in YAML.

A custom function has the same contract as a built-in one, and its second parameter `cfg` is
annotated with the user's own pydantic model, which validates `args` at config load::

    # my_algos.py
    class ShapedArgs(BaseModel):
        scale: float = 1.0

    def shaped_grpo(inputs: AdvantageInputs, cfg: ShapedArgs) -> AdvantageOutputs: ...

    # config.yaml (beside my_algos.py; `my_pkg.algos:shaped_grpo` names an installed module)
    algorithm:
      advantage: {type: custom, path: "my_algos.py:shaped_grpo", args: {scale: 2.0}}

A path that does not import, a function whose signature does not fit, or `args` that its model
rejects fail when the config is loaded, with a message that names the path and the problem.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, JsonValue, PrivateAttr, ValidationError, model_validator
from torch import Tensor

from agentscope_rft.algorithms.base import AdvantageInputs, AdvantageOutputs, LossInputs
from agentscope_rft.algorithms.spec import AdvantageConfigBase, PolicyLossConfigBase

CustomFn = Callable[[object, BaseModel], object]


def _import_path(path: str, what: str) -> object:
    """The object at `package.module:attr` or `path/to/file.py:attr` (a file path in a config
    file is made relative to the config file's folder when it is loaded)."""
    module_name, sep, attr_path = path.rpartition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(
            f"{what} path {path!r} must look like 'package.module:function' or "
            "'path/to/file.py:function'"
        )
    target: object
    if module_name.endswith(".py") or "/" in module_name:
        file = Path(module_name).expanduser()
        if not file.is_file():
            raise ValueError(f"{what} {path!r}: file {file} does not exist")
        # workflows' loader: the file may import the files beside it
        from agentscope_rft.api import import_file

        try:
            target = import_file(file)
        except Exception as err:
            raise ValueError(
                f"{what} {path!r}: {file} does not import ({type(err).__name__}: {err})"
            ) from err
    else:
        try:
            target = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(
                f"{what} {path!r}: cannot import module {module_name!r} ({err}); for a file of "
                f"yours, give its path instead, e.g. '{module_name.replace('.', '/')}.py:"
                f"{attr_path}' (relative to the config file)"
            ) from err
    for name in attr_path.split("."):
        if not hasattr(target, name):
            raise ValueError(f"{what} {path!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, name)
    return target


def resolve_custom(
    path: str, what: str, inputs_type: type, output_check: Callable[[object], bool]
) -> tuple[CustomFn, type[BaseModel]]:
    """Import `path` and check that it is `fn(inputs: inputs_type, cfg: SomeModel)`.

    Returns the function and its config model. `output_check` tests the return annotation when
    there is one.

    Raises:
        ValueError: the path does not import, or the signature does not fit (says why).

    Example:
        >>> fn, args_model = resolve_custom(
        ...     "my_algos:shaped_grpo", "custom advantage", AdvantageInputs, lambda t: True
        ... )  # doctest: +SKIP
    """
    fn = _import_path(path, what)
    if not callable(fn):
        raise ValueError(f"{what} {path!r} is not callable")
    usage = f"it must be `def fn(inputs: {inputs_type.__name__}, cfg: YourArgsModel)`"
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise ValueError(f"{what} {path!r} is async; {usage} (plain, not `async def`)")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} {path!r}: cannot read its signature ({err}); {usage}") from err
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    extra_required = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if len(positional) != 2 or extra_required:
        names = ", ".join(p.name for p in params) or "no parameters"
        raise ValueError(f"{what} {path!r} takes ({names}); {usage}")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # any failure to evaluate annotations is reported, not swallowed
        raise ValueError(f"{what} {path!r}: cannot resolve its type annotations ({err})") from err
    inputs_hint = hints.get(positional[0].name)
    if inputs_hint is not None and inputs_hint is not inputs_type:
        raise ValueError(
            f"{what} {path!r}: its first parameter {positional[0].name!r} is annotated "
            f"{inputs_hint!r}; {usage}"
        )
    cfg_hint = hints.get(positional[1].name)
    if not (isinstance(cfg_hint, type) and issubclass(cfg_hint, BaseModel)):
        raise ValueError(
            f"{what} {path!r}: its second parameter {positional[1].name!r} must be annotated with "
            f"a pydantic BaseModel subclass that validates `args` (got {cfg_hint!r}); {usage}"
        )
    if "return" in hints and not output_check(hints["return"]):
        raise ValueError(f"{what} {path!r}: its return annotation {hints['return']!r} does not fit")
    return typing.cast(CustomFn, fn), cfg_hint


def _without_function(state: dict[Any, Any]) -> dict[Any, Any]:
    """A custom config's pickle state without the imported function: unpickling (in a trainer's
    worker process) imports it again from `path`, as a function from a file has no importable
    module name there."""
    return {**state, "__pydantic_private__": {}}


def _validate_args(
    args_model: type[BaseModel], args: dict[str, JsonValue], where: str
) -> BaseModel:
    try:
        return args_model.model_validate(args)
    except ValidationError as err:
        raise ValueError(
            f"{where}: args do not validate against {args_model.__name__}: {err}"
        ) from err


class CustomAdvantageConfig(AdvantageConfigBase):
    """A user's advantage estimator `fn(inputs: AdvantageInputs, cfg: ArgsModel) ->
    AdvantageOutputs`, by import path."""

    type: Literal["custom"] = "custom"
    path: str = Field(min_length=3)
    """The function: `path/to/file.py:function` (relative to the config file) or
    `package.module:function` (importable)."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """Arguments, validated by the model that annotates the function's `cfg` parameter."""
    needs_critic: bool = False
    """The estimator reads `AdvantageInputs.values`, so the trainer must run a critic."""
    group_baseline: bool = False
    """The estimator's baseline comes from the task group (zero-variance groups are dropped)."""

    _fn: CustomFn = PrivateAttr()
    _args: BaseModel = PrivateAttr()

    @model_validator(mode="after")
    def _resolve(self) -> CustomAdvantageConfig:
        self._import()
        return self

    def _import(self) -> None:
        what = "custom advantage"
        self._fn, args_model = resolve_custom(
            self.path, what, AdvantageInputs, lambda hint: hint is AdvantageOutputs
        )
        self._args = _validate_args(args_model, self.args, f"{what} {self.path!r}")

    def __getstate__(self) -> dict[Any, Any]:
        return _without_function(super().__getstate__())

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._import()

    def uses_critic(self) -> bool:
        return self.needs_critic

    def uses_group_baseline(self) -> bool:
        return self.group_baseline


def _call(fn: CustomFn, inputs: object, args: BaseModel, where: str) -> object:
    """Call a user's function; an exception it raises is re-raised naming the plug-in."""
    try:
        return fn(inputs, args)
    except Exception as err:
        raise RuntimeError(f"{where} raised {type(err).__name__}: {err}") from err


def _check_per_token(
    value: object, name: str, mask: Tensor, where: str, finite: bool = True
) -> Tensor:
    """`value` as a float [N, T] tensor (with finite values on trained tokens), or a clear
    error."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{where} returned {name} of type {type(value).__name__}, not a Tensor")
    if value.shape != mask.shape:
        raise ValueError(
            f"{where} returned {name} of shape {tuple(value.shape)}; expected the per-token "
            f"shape {tuple(mask.shape)} (loss_mask's)"
        )
    if not (value.is_floating_point() or value.dtype in (torch.bool, torch.int32, torch.int64)):
        raise TypeError(f"{where} returned {name} of dtype {value.dtype}; return real values")
    if not value.is_floating_point():
        value = value.to(torch.float32)
    bad = int((~torch.isfinite(value.detach()) & mask.bool()).sum()) if finite else 0
    if bad:
        raise ValueError(
            f"{where} returned {name} with {bad} non-finite (NaN or inf) values on trained "
            f"tokens of {int(mask.bool().sum())}; check it for divisions by zero (e.g. a std of "
            "a group whose rewards are all equal) and log of 0"
        )
    return value


def custom_advantages(inputs: AdvantageInputs, cfg: CustomAdvantageConfig) -> AdvantageOutputs:
    """Call the user's estimator with its validated args; checks what it returns (type, shapes,
    finite values on trained tokens, float metrics)."""
    where = f"custom advantage {cfg.path!r}"
    out = _call(cfg._fn, inputs, cfg._args, where)
    if not isinstance(out, AdvantageOutputs):
        raise TypeError(f"{where} returned {type(out).__name__}, not AdvantageOutputs")
    mask = inputs.loss_mask
    advantages = _check_per_token(out.advantages, "advantages", mask, where)
    returns = None
    if out.returns is not None:
        returns = _check_per_token(out.returns, "returns", mask, where)
    elif cfg.needs_critic:
        raise ValueError(
            f"{where} has needs_critic: true but returned no returns: return the critic's "
            "targets [N, T] in AdvantageOutputs.returns (the value head trains on them)"
        )
    if not isinstance(out.metrics, dict) or not all(
        isinstance(v, int | float) or (isinstance(v, Tensor) and v.numel() == 1)
        for v in out.metrics.values()
    ):
        raise TypeError(f"{where} must return metrics as {{name: float}}, got {out.metrics!r}")
    metrics = {str(k): float(v) for k, v in out.metrics.items()}
    return AdvantageOutputs(advantages=advantages, returns=returns, metrics=metrics)


def _is_loss_output(hint: object) -> bool:
    return typing.get_origin(hint) is tuple


class CustomPolicyLossConfig(PolicyLossConfigBase):
    """A user's policy loss `fn(inputs: LossInputs, cfg: ArgsModel) -> (loss [B, T], metrics
    {name: [B, T]})`, by import path."""

    type: Literal["custom"] = "custom"
    path: str = Field(min_length=3)
    """The function: `path/to/file.py:function` (relative to the config file) or
    `package.module:function` (importable)."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """Arguments, validated by the model that annotates the function's `cfg` parameter."""

    _fn: CustomFn = PrivateAttr()
    _args: BaseModel = PrivateAttr()

    @model_validator(mode="after")
    def _resolve(self) -> CustomPolicyLossConfig:
        self._import()
        return self

    def _import(self) -> None:
        what = "custom policy loss"
        self._fn, args_model = resolve_custom(self.path, what, LossInputs, _is_loss_output)
        self._args = _validate_args(args_model, self.args, f"{what} {self.path!r}")

    def __getstate__(self) -> dict[Any, Any]:
        return _without_function(super().__getstate__())

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._import()


def custom_policy_loss(
    inputs: LossInputs, cfg: CustomPolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """Call the user's loss with its validated args; checks what it returns (a per-token loss
    that is finite on trained tokens and has a gradient, per-token metrics)."""
    where = f"custom policy loss {cfg.path!r}"
    out = _call(cfg._fn, inputs, cfg._args, where)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(
            f"{where} must return (loss [B, T], metrics {{name: [B, T]}}), got {type(out).__name__}"
        )
    mask = inputs.loss_mask
    loss = _check_per_token(out[0], "a loss", mask, where)
    if inputs.logprobs.requires_grad and not loss.requires_grad:
        raise ValueError(
            f"{where} returned a loss without a gradient: compute it from inputs.logprobs "
            "(the current policy's; old_logprobs, rollout_logprobs and advantages are constants)"
        )
    metrics: dict[str, Tensor] = {}
    for name, value in out[1].items():
        metrics[str(name)] = _check_per_token(
            value, f"metric {name!r}", mask, where, finite=False
        ).detach()
    return loss, metrics
