"""Every config key is read by the code that runs: a documented key that nothing reads does nothing.

The docs tests check that every key is documented; this one checks the other half: for every field
of every config model (the run config's sections, their `type`-keyed variants and the algorithm
configs), the package reads that name somewhere outside the config models' own validators, as an
attribute (`cfg.reward_gamma`) or as a string key (`overrides["temperature"]`, for sections that
travel as dicts). A key that only exists in its model fails here.

The check is by name, so a key named like one read elsewhere passes; the list of names that need a
reason (`READ_ELSEWHERE`) stays short, and a new key nobody reads fails. A name read as an attribute
must be read on a config object at least once (`config.x`, `cfg.x`, `engine.x`, `self.x` inside a
config model): `sync.method` passed for years because `request.method` is read in the gateway.
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


def _receiver(node: ast.Attribute) -> str:
    """The name an attribute is read on: `engine` for `config.engine.x`, `?` for a call's result."""
    value = node.value
    if isinstance(value, ast.Name):
        return value.id
    return value.attr if isinstance(value, ast.Attribute) else "?"


def _section_fields(models: set[type[BaseModel]]) -> set[str]:
    """Names of the fields that hold a section (`engine`, `wandb`, `dynamic_sampling`, ...)."""
    names = set()
    for model in models:
        for name, field in model.model_fields.items():
            stack = [field.annotation]
            while stack:
                arg = stack.pop()
                stack.extend(getattr(arg, "__args__", ()))
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    names.add(name)
    return names


# What code calls a config object it reads keys from, besides a section's own field name (or a
# prefix of it: `ex` for the explorer, `dynamic` for `dynamic_sampling`).
CONFIG_NAMES = {"config", "cfg", "settings", "section", "spec"}


def attribute_reads(models: set[type[BaseModel]]) -> tuple[dict[str, set[str]], set[str]]:
    """(name -> receivers it is read as an attribute on, names read on a config object)."""
    sections = _section_fields(models)
    model_names = {m.__name__ for m in models}
    receivers: dict[str, set[str]] = {}
    on_config: set[str] = set()
    for file in PACKAGE.rglob("*.py"):
        if file.name == "config_reference.py":
            continue
        tree = ast.parse(file.read_text(), str(file))
        own = {  # `self.x` inside a config model's own (non-validator) methods
            id(n)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef) and cls.name in model_names
            for n in ast.walk(cls)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            receiver = _receiver(node)
            receivers.setdefault(node.attr, set()).add(receiver)
            if (
                receiver in CONFIG_NAMES
                or (receiver == "self" and id(node) in own)
                or any(s.startswith(receiver) for s in sections if len(receiver) > 1)
            ):
                on_config.add(node.attr)
    return receivers, on_config


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


def test_every_config_key_read_as_an_attribute_is_read_on_a_config():
    """A key whose name is read only on other objects (`request.method`) is not read."""
    models = _config_models()
    receivers, on_config = attribute_reads(models)
    strings = package_reads() - set(receivers)  # names read as dict keys or via getattr only
    unread = sorted(
        f"{model.__name__}.{name}"
        for model in models
        for name in model.model_fields
        if name in receivers
        and name not in on_config
        and name not in strings
        and f"{model.__name__}.{name}" not in READ_ELSEWHERE
    )
    assert unread == [], (
        f"config keys read only on objects that are not configs (they do nothing): {unread}"
    )


def test_the_receiver_check_tells_a_config_from_another_object():
    tree = ast.parse("config.sync.method\nrequest.method\nex.reward_gamma\n")
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr != "sync"]
    assert sorted(_receiver(n) for n in nodes) == ["ex", "request", "sync"]
    _, on_config = attribute_reads(_config_models())
    assert "reward_gamma" in on_config and "lr" in on_config
    assert "method" not in on_config  # only `request.method` and the like remain


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
