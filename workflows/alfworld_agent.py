"""The ALFWorld agent: an AgentScope `Agent` that plays one household text game per episode.

Each turn the agent gets the game's text (the opening room description and task, then the
feedback of its last command) and, by default, the commands that are admissible now; it answers
with one command as plain text (no tool call: ALFWorld's actions are text, and a 135M model
copies a listed command far more reliably than it writes a JSON tool call). The command runs in
the game and the next turn begins, until the task is done or `max_steps` commands are spent.

Two context modes (`AlfworldAgentSettings.context`):

- `full`: one conversation for the whole episode. Every call's prompt extends the previous
  prompt + completion exactly, so the episode trains as **one merged sample** whose game
  observations are masked out (loss mask 0) and whose commands are trained.
- `window`: every turn is a fresh single-turn prompt holding the task, the last `window` turns
  (observation and command) as text, and the current observation (the prompt of verl-agent /
  GiGPO). Each turn is **its own sample**; train it with step-wise advantages (`stepwise`, or
  `gigpo` for anchor-state step groups: the agent records each turn's game state with
  `emit_state`). Prompts stay short however long the episode runs.

Reward: 1.0 when the task is done, else `failure_reward` (-0.1 in Trinity's ALFWorld benchmark),
plus optional per-step rewards (`emit_reward`) for commands that are not admissible.

TextWorld is synchronous and not thread-safe: `AlfworldEnv` runs each reset/step in a worker
thread under one process-wide lock, so many episodes interleave in the event loop without blocking
it (see `environments/alfworld/env.py`).

Example:
    >>> from workflows.alfworld_agent import AlfworldAgentSettings, make_workflow
    >>> run = make_workflow(AlfworldAgentSettings(context="window", window=2, max_steps=10))
    >>> run.name
    'alfworld_window'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.message import AssistantMsg, Msg, UserMsg
from agentscope.model import ChatModelBase

from agentscope_rft import Reward, emit_reward, emit_state, workflow
from agentscope_rft.api import Workflow
from environments.alfworld import AlfworldEnv, normalize_command

AGENT_NAME = "player"
SYSTEM_PROMPT = (
    "You play a text game in a household. Reach the goal in few steps. Each turn, reply with "
    "exactly one action from the list of admissible actions, copied exactly, and nothing else."
)
# Commands every room admits that never help a task: hiding them shortens every prompt.
NEVER_USEFUL = ("help", "inventory", "look")
# A worked game (generated layout bedroom-train-3, seed 11; one detour, then the task) shown to
# the agent before its own game: SmolLM2-135M writes free prose to the bare instructions, but
# copies admissible commands after one demonstration.
DEMO_GAME: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        (
            "You are in the middle of a room. Looking quickly around you, you see a "
            "bed 1, a drawer 2, a drawer 1, a shelf 1, and a sidetable 1.\n\nYour task "
            "is to: put a baseballbat in bed."
        ),
        (
            "go to bed 1",
            "go to drawer 1",
            "go to drawer 2",
            "go to shelf 1",
            "go to sidetable 1",
            "help",
            "inventory",
            "look",
        ),
        "go to shelf 1",
    ),
    (
        ("You arrive at shelf 1. On the shelf 1, you see a box 1, and a pen 2."),
        (
            "examine shelf 1",
            "go to bed 1",
            "go to drawer 1",
            "go to drawer 2",
            "go to sidetable 1",
            "help",
            "inventory",
            "look",
            "take box 1 from shelf 1",
            "take pen 2 from shelf 1",
        ),
        "go to sidetable 1",
    ),
    (
        (
            "You arrive at sidetable 1. On the sidetable 1, you see a baseballbat 2, "
            "a baseballbat 1, a desklamp 1, a laptop 1, and a tennisracket 1."
        ),
        (
            "examine sidetable 1",
            "go to bed 1",
            "go to drawer 1",
            "go to drawer 2",
            "go to shelf 1",
            "help",
            "inventory",
            "look",
            "take baseballbat 1 from sidetable 1",
            "take baseballbat 2 from sidetable 1",
            "take laptop 1 from sidetable 1",
            "take tennisracket 1 from sidetable 1",
            "use desklamp 1",
        ),
        "take baseballbat 1 from sidetable 1",
    ),
    (
        ("You pick up the baseballbat 1 from the sidetable 1."),
        (
            "examine baseballbat 1",
            "examine sidetable 1",
            "go to bed 1",
            "go to drawer 1",
            "go to drawer 2",
            "go to shelf 1",
            "help",
            "inventory",
            "look",
            "move baseballbat 1 to sidetable 1",
            "use desklamp 1",
        ),
        "go to bed 1",
    ),
    (
        ("You arrive at bed 1. On the bed 1, you see nothing."),
        (
            "examine baseballbat 1",
            "examine bed 1",
            "go to drawer 1",
            "go to drawer 2",
            "go to shelf 1",
            "go to sidetable 1",
            "help",
            "inventory",
            "look",
            "move baseballbat 1 to bed 1",
        ),
        "move baseballbat 1 to bed 1",
    ),
)
WINDOW_DEMO_TURNS = (2, 4)
"""The demo turns shown in `window` mode (each is a whole prompt there): taking the object and
putting it in place, with the turns before them in the window."""
_PREFIX = re.compile(r"^\s*(?:>|action\s*:|command\s*:|\d+[.)]|[-*])\s*", re.IGNORECASE)


@dataclass(frozen=True)
class AlfworldAgentSettings:
    """How the ALFWorld agent plays (one instance per workflow; see `make_workflow`).

    A task row may set `max_steps` for itself; it wins over the settings.
    """

    max_steps: int = 30
    """Commands per episode; the episode is lost when they are spent (ALFWorld: 50, Trinity: 30)."""
    context: Literal["full", "window"] = "full"
    """`full`: the whole episode in one conversation (one merged sample). `window`: a fresh
    prompt per turn with the last `window` turns (one sample per turn)."""
    window: int = 3
    """Past turns shown in `window` mode."""
    show_admissible: bool = True
    """List the admissible commands in every observation."""
    hide_never_useful: bool = True
    """Leave `help`, `inventory` and `look` out of that list (they still work when typed)."""
    failure_reward: float = -0.1
    """Episode reward when the task is not done (success is 1.0)."""
    invalid_command_reward: float = 0.0
    """Per-step reward (`emit_reward`) for a command that is not admissible (e.g. -0.05)."""
    subgoal_reward: float = 0.0
    """Per-step reward (`emit_reward`) the first time the agent reaches each subgoal of a
    `put ... in/on ...` task: picking up an object of the goal's type, then going to a
    receptacle of the target's type while holding it (0: the outcome alone counts). Both of
    alfworld's phrasings count ("put a hot egg in X", "heat some egg and put it in X"). Shaping
    for a model that rarely wins by chance; success is still judged by the game alone."""
    demo: bool = True
    """Place one worked game (`DEMO_GAME`) in the agent's memory before its own game."""
    record_states: bool = True
    """Record each turn's game state with `emit_state` (anchor states for `gigpo`)."""

    def __post_init__(self) -> None:
        check_max_steps(self.max_steps, "AlfworldAgentSettings.max_steps")
        if self.context not in ("full", "window"):
            raise ValueError(f"context must be 'full' or 'window', got {self.context!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1 past turn, got {self.window}")


# alfworld's two templates per task type: "put a hot egg in diningtable" and "heat some egg and
# put it in diningtable" (`alfworld.gen.goal_library`); a game may use either.
_PUT_GOAL = re.compile(
    r"^(?:put (?:a |an |some |two )?(?:(?:hot|cool|cold|clean|heated|cooled|cleaned) )?"
    r"|(?:heat|cool|clean) some |find two )"
    r"(?P<obj>\w+) (?:and put (?:it|them) )?(?:in|on|in/on) (?:a |an |the )?(?:\w+ )?"
    r"(?P<target>\w+)$"
)


class SubgoalTracker:
    """Which subgoals of a `put <object> in/on <target>` goal an episode has reached.

    Example:
        >>> tracker = SubgoalTracker("put some basketball on sidetable")
        >>> tracker.update("take basketball 1 from bed 1", "You pick up the basketball 1.")
        1
        >>> tracker.update("go to sidetable 1", "You arrive at sidetable 1.")
        1
        >>> tracker.update("go to sidetable 1", "Nothing happens.")
        0
    """

    def __init__(self, goal: str) -> None:
        match = _PUT_GOAL.match(goal.strip().lower())
        self.obj = match["obj"] if match else None
        self.target = match["target"] if match else None
        self.holding = False
        self.reached: set[str] = set()

    def update(self, command: str, feedback: str) -> int:
        """Subgoals first reached by this step (0, 1)."""
        if self.obj is None:
            return 0
        text = feedback.strip().lower()
        before = len(self.reached)
        if command.startswith(f"take {self.obj} ") and text.startswith("you pick up"):
            self.holding = True
            self.reached.add("holding")
        elif command.startswith(("move ", "put ")) and text.startswith(("you move", "you put")):
            self.holding = False
        elif (
            self.holding
            and command.startswith(f"go to {self.target} ")
            and text.startswith("you arrive")
        ):
            self.reached.add("at_target")
        return len(self.reached) - before


def check_max_steps(value: Any, where: str) -> int:
    """`value` as a step limit, or a ValueError that names `where` and the fix."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{where} = {value!r}: the step limit must be a whole number >= 1 "
            "(ALFWorld uses 50, Trinity's benchmark 30)"
        )
    return value


def parse_command(reply: str) -> str:
    """The command in a model reply: its first non-empty line up to the first comma (no ALFWorld
    command has one; a small model sometimes copies the whole list), without a leading `>`,
    `Action:`, list marker, quotes or trailing period, normalized as the game spells commands.

    Example:
        >>> parse_command('Action: "Go to fridge 1."\\nThen open it.')
        'go to fridge 1'
        >>> parse_command("go to cabinet 1, go to cabinet 2, go to")
        'go to cabinet 1'
    """
    line = next((ln for ln in (reply or "").splitlines() if ln.strip()), "")
    line = _PREFIX.sub("", line.split(",", 1)[0]).strip().strip("\"'`").strip()
    return normalize_command(line)


def shown_commands(admissible: list[str], settings: AlfworldAgentSettings) -> list[str]:
    """The admissible commands listed to the agent."""
    if not settings.hide_never_useful:
        return list(admissible)
    return [c for c in admissible if c not in NEVER_USEFUL]


def clean_text(text: str) -> str:
    """The game's text without TextWorld's welcome banner."""
    return text.replace("-= Welcome to TextWorld, ALFRED! =-", "").strip()


def observation_text(text: str, admissible: list[str], settings: AlfworldAgentSettings) -> str:
    """One observation as the agent reads it: the game text, then the admissible commands."""
    text = clean_text(text)
    if not settings.show_admissible:
        return text
    return f"{text}\nAdmissible actions: {', '.join(shown_commands(admissible, settings))}."


def window_prompt(
    goal: str, history: list[tuple[str, str]], current: str, settings: AlfworldAgentSettings
) -> str:
    """A `window`-mode prompt: the task, the last `settings.window` (observation, command) turns
    and the current observation (verl-agent's ALFWorld prompt, shortened)."""
    shown = history[-settings.window :]
    lines = [f"Your task is to: {goal}."]
    if shown:
        lines.append(
            f"You have taken {len(history)} step(s). Your last {len(shown)} step(s), oldest first:"
        )
        first = len(history) - len(shown) + 1
        for k, (observation, command) in enumerate(shown, start=first):
            lines.append(f"[{k}] {clean_text(observation).splitlines()[0]} > {command}")
    lines.append(f"Now: {current}")
    return "\n".join(lines)


def demo_messages(settings: AlfworldAgentSettings) -> list[Msg]:
    """The worked game as earlier turns: in `full` mode the whole conversation; in `window` mode
    each of its turns as the single-turn prompt that mode would have shown, with its command."""
    goal = DEMO_GAME[0][0].split("Your task is to: ", 1)[-1].strip().rstrip(".")
    messages: list[Msg] = []
    history: list[tuple[str, str]] = []
    for k, (text, admissible, command) in enumerate(DEMO_GAME):
        current = observation_text(text, list(admissible), settings)
        if settings.context == "window":
            current = window_prompt(goal, history, current, settings)
        if settings.context == "full" or k in WINDOW_DEMO_TURNS:
            messages.append(UserMsg(name="user", content=current))
            messages.append(AssistantMsg(name=AGENT_NAME, content=command))
        history.append((text, command))
    return messages


def build_agent(model: ChatModelBase) -> Agent:
    """The player: no tools, one model call per reply, no injected timestamp (reproducible)."""
    return Agent(
        name=AGENT_NAME,
        system_prompt=SYSTEM_PROMPT,
        model=model,
        react_config=ReActConfig(max_iters=1),
        injection_config=InjectionConfig(inject_runtime_state=False),
    )


def state_key(text: str, admissible: list[str]) -> str:
    """The anchor state of a turn: the game's text plus the admissible commands (which encode
    where the agent stands and what it holds; "Nothing happens." alone would not)."""
    return text.strip() + "\n" + "|".join(sorted(admissible))


async def play(
    task: dict[str, Any], model: ChatModelBase, settings: AlfworldAgentSettings
) -> Reward:
    """Plays one game; returns its reward (1.0 on success, else `settings.failure_reward`)."""
    if "max_steps" in task:
        settings = replace(
            settings,
            max_steps=check_max_steps(task["max_steps"], f"task {task.get('id')!r} max_steps"),
        )
    agent = build_agent(model)
    demos = demo_messages(settings) if settings.demo else []
    invalid = 0
    history: list[tuple[str, str]] = []
    with AlfworldEnv(task, max_steps=settings.max_steps) as env:
        first = await env.reset()
        text, admissible, goal = first.text, first.admissible_commands, first.goal
        subgoals = SubgoalTracker(goal)
        won, steps = False, 0
        while steps < settings.max_steps:
            current = observation_text(text, admissible, settings)
            if settings.context == "window":
                agent.state.context.clear()
                current = window_prompt(goal, history, current, settings)
            if settings.context == "window" or steps == 0:
                agent.state.context.extend(demos)
            if settings.record_states:
                emit_state(state_key(text, admissible), agent=AGENT_NAME)
            reply = await agent.reply(UserMsg(name="user", content=current))
            command = parse_command(reply.get_text_content() or "")
            if command not in admissible:
                invalid += 1
                if settings.invalid_command_reward:
                    emit_reward(settings.invalid_command_reward)
            result = await env.step(command)
            if subgoals.update(command, result.text) and settings.subgoal_reward:
                emit_reward(settings.subgoal_reward)
            history.append(
                (observation_text(text, [], replace(settings, show_admissible=False)), command)
            )
            text, admissible, won, steps = (
                result.text,
                result.admissible_commands,
                result.won,
                result.steps,
            )
            if result.done:
                break
    return Reward(
        value=1.0 if won else settings.failure_reward,
        success=won,
        # Out of commands: the explorer records the episode as truncated by the turn limit (and
        # still trains on it with the failure reward).
        truncated=None if won else "turn_limit",
        metrics={
            "won": float(won),
            "steps": float(steps),
            "invalid_commands": float(invalid),
            "invalid_rate": invalid / max(steps, 1),
            "subgoals": float(len(subgoals.reached)),
        },
    )


def make_workflow(
    settings: AlfworldAgentSettings | None = None, name: str | None = None
) -> Workflow:
    """A trainable workflow `run(task, model)` playing ALFWorld with these settings.

    Args:
        settings: How to play (default: full history, 30 steps, admissible commands listed).
        name: The workflow's name (default `alfworld_<context>`).

    Example:
        >>> run = make_workflow(AlfworldAgentSettings(max_steps=10))
        >>> run.name
        'alfworld_full'
    """
    settings = settings or AlfworldAgentSettings()

    async def run(task: dict[str, Any], model: ChatModelBase) -> Reward:
        return await play(task, model, settings)

    registered: Workflow = workflow(run, name=name or f"alfworld_{settings.context}")
    return registered


run = make_workflow()
"""The agent with default settings: full history, 30 steps, admissible commands listed."""
run_window = make_workflow(AlfworldAgentSettings(context="window"))
"""The agent with a sliding window of the last 3 turns (one sample per turn)."""
