"""Every config key is read by the code that runs: a documented key that nothing reads does nothing.

The docs tests check that every key is documented; this one checks the other half: for every field
of every config model (the run config's sections, their `type`-keyed variants and the algorithm
configs), the package reads that name somewhere outside the config models' own validators, as an
attribute (`cfg.reward_gamma`) or as a string key (`overrides["temperature"]`, for sections that
travel as dicts). A key that only exists in its model fails here.

The check is by name, so a key named like one read elsewhere passes; the list of names that need a
reason (`READ_ELSEWHERE`) stays short, and a new key nobody reads fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import BaseModel

import agentscope_rft
from agentscope_rft.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from agentscope_rft.config import RunConfig
from agentscope_rft.config_base import Section

PACKAGE = Path(agentscope_rft.__file__).parent
VALIDATORS = {"field_validator", "model_validator"}


def _config_models() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in found:
            return
        found.add(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                arg = stack.pop()
                stack.extend(getattr(arg, "__args__", ()))
                if isinstance(arg, type) and issubclass(arg, Section):
                    visit(arg)

    visit(RunConfig)
    for registry in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES):
        for entry in registry.values():
            config = getattr(entry, "config", entry)
            if isinstance(config, type) and issubclass(config, BaseModel):
                visit(config)
    return found


def _is_validator(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in VALIDATORS:
            return True
    return False


def _names_read(tree: ast.AST) -> set[str]:
    """Attribute names loaded and string constants used (docstrings excepted) outside
    validators."""
    names: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if _is_validator(node):
            skip.update(id(n) for n in ast.walk(node))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.Call):  # getattr(cfg, "name")
            func = node.func
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) > 1:
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
    return names


def package_reads() -> set[str]:
    names: set[str] = set()
    for file in PACKAGE.rglob("*.py"):
        if file.name == "config_reference.py":  # it reads every key, to document it
            continue
        names |= _names_read(ast.parse(file.read_text(), str(file)))
    return names


# Keys read under another name, with where.
READ_ELSEWHERE: dict[str, str] = {
    "CustomAdvantageConfig.args": "validated into `_args` (algorithms/custom.py), the custom "
    "function's `cfg`",
    "CustomPolicyLossConfig.args": "validated into `_args` (algorithms/custom.py), the custom "
    "function's `cfg`",
}


def unread_keys(reads: set[str]) -> list[str]:
    return sorted(
        f"{model.__name__}.{name}"
        for model in _config_models()
        for name in model.model_fields
        if name not in reads and f"{model.__name__}.{name}" not in READ_ELSEWHERE
    )


def test_every_config_key_is_read_by_code():
    unread = unread_keys(package_reads())
    assert unread == [], (
        f"config keys that no code reads (they do nothing): {unread}; use them or remove them"
    )


def test_the_check_catches_a_key_nobody_reads():
    """The check itself can fail: a model with a key that no code reads is reported."""

    class Probe(Section):
        reward_gamma: float = 1.0
        """Read by the explorer."""
        never_read_anywhere_xyz: int = 0
        """Read by nobody."""

    reads = package_reads()
    assert "reward_gamma" in reads
    assert [n for n in Probe.model_fields if n not in reads] == ["never_read_anywhere_xyz"]
