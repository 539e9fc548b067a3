"""What the docs tell a user to write or run exists: every YAML block loads as a run config (on
top of the quickstart's, with the `# my_x.py` files the same page shows written beside it), and
every `agentscope-rft` command names a subcommand and flags the CLI has, and its `--set`s load on
its `--config` (an artefacts index's re-make commands included)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from agentscope_rft.cli import app
from agentscope_rft.config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "environments" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "examples").glob("*/README.md"),
        *(ROOT / "examples").glob("**/ARTEFACTS.md"),
        *(ROOT / "benchmarks").glob("**/ARTEFACTS.md"),
    ]
)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
QUICKSTART = ROOT / "examples" / "quickstart" / "config.yaml"


def fenced(page: Path, lang: str) -> list[tuple[int, str]]:
    """(line, body) of each fenced block of `lang` in `page`."""
    text = page.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == lang
    ]


def alternatives(body: str) -> list[str]:
    """A block that repeats a top-level key lists alternatives, one per top-level entry."""
    tops = [line.split(":")[0] for line in body.splitlines() if line[:1].isalnum()]
    if len(tops) == len(set(tops)):
        return [body]
    groups: list[list[str]] = []
    for line in body.splitlines():
        if line[:1].isalnum() or not groups:
            groups.append([])
        groups[-1].append(line)
    return ["\n".join(group) for group in groups]


def yaml_cases() -> list[Any]:
    cases = []
    for page in PAGES:
        for line, body in fenced(page, "yaml"):
            for n, alternative in enumerate(alternatives(body)):
                name = f"{page.relative_to(ROOT)}:{line}#{n}"
                cases.append(pytest.param(page, alternative, id=name))
    return cases


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, section by section; a section of another `type` replaces base's."""
    for key, value in extra.items():
        old = base.get(key)
        same_type = isinstance(old, dict) and old.get("type") == (value or {}).get("type")
        if isinstance(value, dict) and isinstance(old, dict) and ("type" not in value or same_type):
            merge(old, value)
        else:
            base[key] = value
    return base


def test_the_pages_hold_yaml_and_commands():
    assert len(yaml_cases()) > 20 and len(command_cases()) > 40


@pytest.mark.parametrize(("page", "snippet"), yaml_cases())
def test_yaml_block_loads(page: Path, snippet: str, tmp_path: Path) -> None:
    for _, code in fenced(page, "python"):  # `# my_algos.py` blocks the YAML names by path
        first = code.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            (tmp_path / first[2:]).write_text(code, encoding="utf-8")
    base = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    base["workflow"] = f"{QUICKSTART.parent / 'app.py'}:run"
    base["tasks"] = {
        key: str(QUICKSTART.parent / value) if key in ("train", "val", "test") else value
        for key, value in base["tasks"].items()
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(merge(base, yaml.safe_load(snippet))), encoding="utf-8")
    load_config(config)


def commands(text: str) -> list[str]:
    """The `agentscope-rft ...` commands of a shell block, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if "agentscope-rft " in line:
            found.append(line[line.index("agentscope-rft ") :])
    return found


def command_cases() -> list[Any]:
    cases = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = [body for _, body in fenced(page, "bash")]
        inline = re.findall(r"`((?:\.venv/bin/)?agentscope-rft [^`]+)`", text)
        for command in [c for body in blocks for c in commands(body)] + inline:
            cases.append(pytest.param(command, id=f"{page.relative_to(ROOT)}: {command[:60]}"))
    return cases


def command_words(command: str) -> list[str]:
    """The words after `agentscope-rft`, optional `[...]` parts included."""
    return shlex.split(re.sub(r"\[([^]]*)\]", r"\1", command).replace("|", " "))[1:]


@pytest.mark.parametrize("command", command_cases())
def test_command_names_existing_flags(command: str) -> None:
    words = command_words(command)
    cli: Any = typer.main.get_command(app)  # a group has `commands`
    while hasattr(cli, "commands") and words and not words[0].startswith("-"):
        if words[0] == "...":
            return  # `agentscope-rft buffer ...`: the group, not a command
        assert words[0] in cli.commands, f"{command!r}: no command {words[0]!r}"
        cli = cli.commands[words.pop(0)]
    options = {opt for param in cli.params for opt in (*param.opts, *param.secondary_opts)}
    for word in words:
        flag = word.split("=")[0]
        if flag.startswith("-") and flag != "-":
            assert flag in options, f"{command!r}: {cli.name} has no option {flag}"


@pytest.mark.parametrize("command", [c for c in command_cases() if " --set" in c.values[0]])
def test_command_sets_load_on_its_config(command: str) -> None:
    """A `--set` of a key since renamed, or a value the schema refuses, fails here: on the
    command's own `--config` where the checkout has it, else on a minimal config."""
    words = command_words(command)
    sets = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--set"]
    if any(mark in value for value in sets for mark in ("...", "<", "$")):
        return  # a placeholder (`--set run.dir=...`), not a value
    config = words[words.index("--config") + 1] if "--config" in words else None
    if config is not None and (ROOT / config).is_file():
        load_config(ROOT / config, sets)
    else:
        load_config(None, ["workflow=app.py:run", "tasks.train=t.jsonl", *sets])
