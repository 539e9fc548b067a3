"""A learnable toy task for a tiny random model: reward = share of uppercase letters replied."""

from __future__ import annotations

from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg


def uppercase_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


async def run(task: dict, model) -> float:
    agent = Agent(
        name="shouter",
        system_prompt="Reply.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    reply = await agent.reply(UserMsg(name="user", content=task["prompt"]))
    return uppercase_share(reply.get_text_content() or "")


async def broken(task: dict, model) -> float:
    raise RuntimeError("the app is broken")


async def slow(task: dict, model) -> float:
    """`run` after a pause: an episode long enough to be stopped in the middle."""
    import asyncio

    await asyncio.sleep(1.0)
    return await run(task, model)


async def paused(task: dict, model) -> float:
    """`run` after a short pause: a run of a few steps outlasts a poll for its first checkpoint
    by seconds, without spending a second on each of its episodes."""
    import asyncio

    await asyncio.sleep(0.25)
    return await run(task, model)


_SERVER: list[object] = []


async def run_with_server(task: dict, model) -> float:
    """`run`, in an app that starts a helper process once (as apps start environment servers);
    its pid goes to `$TOY_APP_PID_FILE`. Episodes take a moment, so a signal lands mid-step."""
    import asyncio
    import os
    import subprocess

    if not _SERVER:
        server = subprocess.Popen(["sleep", "600"])
        _SERVER.append(server)
        with open(os.environ["TOY_APP_PID_FILE"], "w") as handle:
            handle.write(str(server.pid))
    await asyncio.sleep(0.3)
    return await run(task, model)


_EPISODES: list[int] = []


async def by_kind(task: dict, model) -> float:
    """A task whose episodes all score the same (`kind` "solved": 1, "unsolved": 0) or whose
    episodes alternate 0 and 1 (`kind` "mixed", by episode count: a group of two or more always
    has both). The model is asked either way, so every episode gives samples."""
    await run(task, model)
    _EPISODES.append(1)
    if task["kind"] == "mixed":
        return float(len(_EPISODES) % 2)
    return 1.0 if task["kind"] == "solved" else 0.0


async def two_agents(task: dict, model) -> float:
    """A proposer and a critic sharing the policy; reward: the uppercase share of both replies."""
    proposer, critic = (
        Agent(
            name=name,
            system_prompt=prompt,
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        for name, prompt in (("proposer", "Propose."), ("critic", "Criticize."))
    )
    proposal = (
        await proposer.reply(UserMsg(name="user", content=task["prompt"]))
    ).get_text_content()
    critique = (await critic.reply(UserMsg(name="user", content=proposal or ""))).get_text_content()
    return uppercase_share(f"{proposal or ''} {critique or ''}")


_VALIDATIONS: list[int] = []


async def peak_at_third_validation(task: dict, model) -> float:
    """`run` on training tasks; a validation task (`"val_tasks": n` in it, n of them) scores 1
    in the process's third validation and 0 in every other."""
    if "val_tasks" not in task:
        return await run(task, model)
    _VALIDATIONS.append(1)
    await run(task, model)
    return 1.0 if (len(_VALIDATIONS) - 1) // task["val_tasks"] == 2 else 0.0
