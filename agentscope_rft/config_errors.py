"""Reading a config file, and saying what is wrong with one: each problem on one line that names
the file, the line and the key, and the fix.

`read_config_file` parses the YAML (refusing a key given twice, which YAML would let the second
silently win) and records the line of every key; `validation_message` turns pydantic's errors into
lines like `run.steps: Input should be a valid integer (got 'many'; line 3)`, with the section a
misplaced key belongs in (`steps` at the top level: `run.steps`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

KeyPath = tuple[str | int, ...]
"""A key's place in the config: section and key names, list positions as ints."""


class ConfigError(ValueError):
    """A config file or override that does not validate (names the file, key and fix)."""


def config_file_problem(file: Path) -> str | None:
    """Why `file` cannot be read as a config (None: it is a file).

    Cheap on purpose: the CLI asks as it parses `--config`, before the config and training
    modules (torch) import.

    Example:
        >>> config_file_problem(Path("nope.yaml"))
        'config file nope.yaml does not exist'
    """
    if file.is_file():
        return None
    what = "is a folder, not a YAML file" if file.is_dir() else "does not exist"
    return f"config file {file} {what}"


def read_config_file(file: Path) -> tuple[Any, dict[KeyPath, int]]:
    """The YAML data of a config file and the line (1-based) of each key in it.

    Raises:
        ConfigError: the file is not UTF-8, not YAML, or gives a key twice in one mapping.

    Example:
        >>> data, lines = read_config_file(Path("run.yaml"))  # doctest: +SKIP
        >>> lines[("run", "steps")]  # doctest: +SKIP
        3
    """
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {file} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
            "save it as UTF-8 YAML"
        ) from exc
    try:
        node, data = _parse(text, _FAST_LOADER)
    except yaml.YAMLError:
        try:  # PyYAML's own parser: the messages yaml_error_message reads (libyaml's are terser)
            node, data = _parse(text, yaml.SafeLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(yaml_error_message(file, exc)) from exc
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _key_lines(node, (), lines, file)
    return data, lines


_FAST_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader where PyYAML was built with it (same resolver and constructor, ~10x faster)."""


def _parse(text: str, loader_class: type) -> tuple[yaml.Node | None, Any]:
    """The document's node tree and its data, from one parse."""
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        return node, (None if node is None else loader.construct_document(node))
    finally:
        loader.dispose()


def yaml_error_message(file: Path, exc: yaml.YAMLError) -> str:
    """One line: where the YAML broke and what to do (PyYAML's own text spans five lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark.line != getattr(mark, "line", None):
        problem += f" ({context} from line {context_mark.line + 1})"
    if "'\\t'" in problem:
        hint = "indent with spaces: YAML does not allow tabs"
    elif "flow" in (context or "") or "flow" in problem:
        hint = "close each { or [ on the line it belongs to, with a comma between items"
    elif "mapping values are not allowed" in problem:
        hint = "a value holding ': ' must be quoted, and a nested key indented under its section"
    else:
        hint = "check the indentation and quoting there (docs/config.md has an example)"
    return f"config file {file} is not valid YAML: {where}{problem}; {hint}"


def _key_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], file: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in first and key != "<<":
                dotted = ".".join(str(p) for p in (*path, key))
                raise ConfigError(
                    f"config file {file}, line {line}: key {dotted!r} is given twice (first at "
                    f"line {first[key]}; YAML would keep only the last): merge them into one"
                )
            first[key] = line
            lines[(*path, key)] = line
            _key_lines(value_node, (*path, key), lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _key_lines(item, (*path, i), lines, file)


def top_level_problem(file: Path, data: Any) -> str | None:
    """What is wrong with a config file's whole content (empty, a list, a scalar), or None."""
    if isinstance(data, dict):
        return None
    example = "e.g. `workflow: app.py:run` and `tasks: {train: tasks.jsonl}` (docs/config.md)"
    if data is None:
        return f"config file {file} is empty (or only comments): write the run's keys, {example}"
    if isinstance(data, list):
        return (
            f"config file {file} is a list (its lines start with '- '), but a config is a mapping "
            f"of sections: remove the leading '- ', {example}"
        )
    return f"config file {file} holds {data!r}, but a config is a mapping of sections, {example}"


def _models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _models(arg)


def key_paths(root: type[BaseModel]) -> dict[str, list[tuple[str, str | None]]]:
    """Every key name of the config tree, with each dotted path it has and the `type` of the
    section variant that has it (`device`: [(`engine.device`, `embedded`), (`trainer.device`,
    `torch`), ...])."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    seen: set[tuple[str, type[BaseModel]]] = set()

    def visit(model: type[BaseModel], prefix: str) -> None:
        if (prefix, model) in seen or prefix.count(".") > 4:
            return
        seen.add((prefix, model))
        type_field = model.model_fields.get("type")
        tag = type_field.default if type_field is not None else None
        for name, field in model.model_fields.items():
            home = (prefix + name, tag if isinstance(tag, str) else None)
            if home not in found.setdefault(name, []):
                found[name].append(home)
            for sub in _models(field.annotation):
                visit(sub, prefix + name + ".")

    visit(root, "")
    return found


def _models_at(root: type[BaseModel], path: KeyPath) -> list[type[BaseModel]]:
    """The section models a cleaned key path leads to (several for a `type`-keyed union)."""
    models = [root]
    for part in path:
        if isinstance(part, str):
            fields = [m.model_fields[part] for m in models if part in m.model_fields]
            models = [m for f in fields for m in _models(f.annotation)]
    return models


def _misplaced(key: str, where: str, names: dict[str, list[tuple[str, str | None]]]) -> str:
    """Where an unknown key does belong: another `type` of this section, or another section."""
    section = ".".join(p for p in where.split(".") if not p.isdigit())
    homes = names.get(key, [])
    variants = sorted({tag for path, tag in homes if path.rpartition(".")[0] == section and tag})
    if variants:
        kinds = " or ".join(repr(v) for v in variants)
        return f"; {key!r} is a key of {section} type {kinds}: set `type: {variants[0]}` to use it"
    elsewhere = [path for path, _ in homes if path.rpartition(".")[0] != section]
    inside = [path for path in elsewhere if path.startswith(section + ".")]  # one level too high
    return f"; it belongs in {' or '.join(inside or elsewhere)}" if elsewhere else ""


def _clean_location(root: type[BaseModel], loc: tuple[Any, ...]) -> KeyPath:
    """pydantic's error location without its own parts: union members' tags (`trainer.torch`),
    validator names (`function-after[...]`)."""
    models, out = [root], list[str | int]()
    for part in loc:
        if isinstance(part, int):
            out.append(part)
            continue
        name = str(part)
        fields = [m.model_fields[name] for m in models if name in m.model_fields]
        if not fields:
            continue  # a tag or a validator's name
        out.append(name)
        models = [m for f in fields for m in _models(f.annotation)]
    return tuple(out)


def _got(error: Any) -> str:
    value = error.get("input")
    if error["type"] in ("missing", "extra_forbidden") or not isinstance(
        value, str | int | float | bool | type(None)
    ):
        return ""
    return f"got {value!r}"


def validation_message(
    exc: ValidationError,
    source: str,
    root: type[BaseModel],
    lines: dict[KeyPath, int] | None = None,
    overridden: set[str] | None = None,
) -> str:
    """`invalid config <source>: <key>: <what is wrong> (got <value>; line <n>)`, one line per
    error (after a first line naming the source when there are several)."""
    lines, overridden = lines or {}, overridden or set()
    names = key_paths(root)
    out = []
    for error in exc.errors():
        path = _clean_location(root, tuple(error["loc"]))
        where = ".".join(str(p) for p in path)
        message = error["msg"].removeprefix("Value error, ")
        unknown = message.split("'")[1] if message.startswith("unknown") and "'" in message else ""
        if error["type"] in ("model_type", "dict_type", "model_attributes_type"):
            models = _models_at(root, path)
            first = [f for m in models[:1] for f in m.model_fields if f != "type"][:1] or ["key"]
            value = error.get("input") if isinstance(error.get("input"), str) else "value"
            example = f"{where}: {{{first[0]}: {value}}}"
            message = f"is a section: write its keys under it (e.g. `{example}`)"
        elif unknown and "did you mean" not in message:
            home = _misplaced(unknown, where, names)
            if home:  # (the section's own keys would only bury where it goes)
                message = message.split(" (known keys")[0] + home
        notes = [n for n in [_got(error)] if n]
        at = (*path, unknown) if unknown else path
        full = ".".join(str(p) for p in at)
        if any(full == o or full.startswith(o + ".") for o in overridden):
            notes.append("--set")
        else:
            line = next((lines[at[:i]] for i in range(len(at), 0, -1) if at[:i] in lines), 0)
            if line:
                notes.append(f"line {line}")
            # A section's own check (several of its keys together): name the ones --set gave.
            inside = sorted(o for o in overridden if full and o.startswith(full + "."))
            if inside:
                notes.append("--set " + ", ".join(inside))
        suffix = f" ({'; '.join(notes)})" if notes else ""
        out.append(f"{where or '(top level)'}: {message}{suffix}")
    if len(out) == 1:
        return f"invalid config {source}: {out[0]}"
    return f"invalid config {source}:\n" + "\n".join(f"  {line}" for line in out)
