"""The dashboard in a real browser (Playwright driving the OS's Chromium) over a run a tiny
model trained here: the run, its curve, an episode's trained tokens, and a review that a
`train` run then trains on.

Screenshots go to the test's temporary folder (printed); set
`AGENTSCOPE_RFT_DASHBOARD_SCREENSHOTS=docs/images` to refresh the ones in the docs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.dashboard.app import create_app
from agentscope_rft.monitor.status import run_started
from agentscope_rft.runtime.local import train

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install 'agentscope-rft[dev]'"
)
CHROMIUM = (
    os.environ.get("AGENTSCOPE_RFT_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: install Debian's package (apt-get install chromium; .ci/run does) or "
    "point AGENTSCOPE_RFT_CHROMIUM at a Chromium binary",
)
TOKEN = "browser-test-token-0123"
APP = "tests/integration/toy_app.py:run"


@pytest.fixture(scope="module")
def runs_dir(tiny_model_path, tmp_path_factory) -> Path:
    """`runs/toy`: 2 steps of the uppercase toy task with an eval before and after."""
    root = tmp_path_factory.mktemp("dashboard")
    tasks = root / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(6))
    )
    run_dir = root / "runs" / "toy"
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_path}",
            f"workflow={APP}",
            f"tasks.train={tasks}",
            f"tasks.eval={tasks}",
            "tasks.eval_limit=2",
            "run.eval_every=2",
            "explorer.group_size=4",
            "explorer.tasks_per_step=2",
            "explorer.sampling.max_tokens=6",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            "run.steps=2",
            f"run.dir={run_dir}",
            "run.name=toy",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
        ],
    )
    asyncio.run(train(config, run_dir))
    return root / "runs"


@pytest.fixture(scope="module")
def base_url(runs_dir) -> Iterator[str]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(runs_dir, token=TOKEN), log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    started = threading.Event()
    while not started.wait(0.05):  # the server sets `started` once it listens
        if server.started:
            started.set()
        assert thread.is_alive(), "the dashboard server did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def page(base_url, tmp_path_factory):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 860})
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.set_default_timeout(20_000)
        tab.errors = errors  # type: ignore[attr-defined]
        yield tab
        browser.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("screenshots")
    print(f"dashboard screenshots: {folder}")
    return folder


def screenshot(page, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / name), full_page=True)
    docs = os.environ.get("AGENTSCOPE_RFT_DASHBOARD_SCREENSHOTS")
    if docs:
        shutil.copy(shots / name, Path(docs) / name)


def trained_tokens(run_dir: Path, rollout_id: str) -> int:
    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return sum(sum(x["loss_mask"]) for x in lines if x["rollout_id"] == rollout_id)


def test_the_run_its_curve_and_an_episodes_trained_tokens(page, base_url, runs_dir, shots):
    page.goto(f"{base_url}/?token={TOKEN}#runs")
    row = page.locator('tr[data-run-row="toy"]')
    sync_api.expect(row.locator(".badge")).to_have_text("finished")
    sync_api.expect(row).to_contain_text("2 / 2")
    screenshot(page, shots, "dashboard-runs.png")

    page.click('nav a[data-tab="curves"]')
    curve = page.locator('#chart path.series[data-run="toy"]')
    sync_api.expect(curve).to_have_count(1)
    assert curve.get_attribute("d").count("L") == 1  # two train steps: one segment
    page.select_option("#metric", "eval/reward/mean")
    sync_api.expect(curve).to_have_count(1)
    screenshot(page, shots, "dashboard-curves.png")

    page.click('nav a[data-tab="episodes"]')
    page.select_option("#episode-phase", "train")
    rows = page.locator("#episodes-table tbody tr")
    sync_api.expect(rows).to_have_count(16)  # 2 steps x 2 tasks x 4 episodes
    page.select_option("#episode-sort", "-reward")
    first = rows.first
    rollout_id = first.get_attribute("data-rollout")
    first.click()
    sync_api.expect(page.locator("#episode-title")).to_contain_text(rollout_id)
    trained = page.locator(f'[data-sample^="{rollout_id}:"] .tok.trained')
    sync_api.expect(trained).to_have_count(trained_tokens(runs_dir / "toy", rollout_id))
    assert page.locator(f'[data-sample^="{rollout_id}:"] .tok.masked').count() > 5
    # the request messages the call answered (here the task's prompt), before its reply
    prompt = page.locator("#calls li").first.locator(".message-user")
    sync_api.expect(prompt).to_contain_text("Say ")
    screenshot(page, shots, "dashboard-trajectory.png")


def test_a_review_in_the_browser_is_what_train_then_trains_on(
    page, base_url, runs_dir, tiny_model_path, shots, tmp_path
):
    run_dir = runs_dir / "toy"
    page.goto(f"{base_url}/?token={TOKEN}&load=review#episodes")
    page.select_option("#episode-phase", "train")
    rows = page.locator("#episodes-table tbody tr")
    sync_api.expect(rows).to_have_count(16)
    rollout_id = rows.nth(3).get_attribute("data-rollout")
    rows.nth(3).click()
    sync_api.expect(page.locator("#episode-title")).to_contain_text(rollout_id)
    page.fill("#review-score", "7.5")
    page.fill("#review-comment", "reads well")
    page.click("#review-submit")
    sync_api.expect(page.locator("#review-list li")).to_have_count(1)
    page.locator(".call-start").first.click()
    page.fill(".correction-text", "HELLO THERE")
    page.click(".submit-correction")
    sync_api.expect(page.locator("#review-list li")).to_have_count(2)
    sync_api.expect(page.locator("#review-list")).to_contain_text("HELLO THERE")
    screenshot(page, shots, "dashboard-review.png")

    from agentscope_rft.models import load_tokenizer
    from agentscope_rft.review.training import load_review_samples

    tokenizer = load_tokenizer(tiny_model_path)
    rated = load_review_samples(run_dir, "rewards", tokenizer)
    assert {s.rollout_id: s.reward for s in rated}[rollout_id] == 7.5
    (corrected,) = load_review_samples(run_dir, "sft", tokenizer)
    answer = [t for t, m in zip(corrected.token_ids, corrected.loss_mask, strict=True) if m]
    assert tokenizer.decode(answer).startswith("HELLO THERE")

    # `train` on the reviews: one offline SFT step on the corrected answer.
    out = tmp_path / "from-reviews"
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_path}",
            "run.mode=offline",
            "offline.format=review",
            f"offline.path={run_dir}",
            "offline.batch_size=1",
            "algorithm.objective=sft",
            "trainer.dtype=float32",
            "run.steps=1",
            f"run.dir={out}",
            "monitor.tensorboard=false",
        ],
    )
    # (in a thread of its own: Playwright's sync API keeps an event loop in this one)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        metrics = pool.submit(lambda: asyncio.run(train(config, out))).result()
    assert metrics["loss"] > 0
    assert "HELLO THERE" in page.request.get(f"{base_url}/api/run/reviews.jsonl?run_id=toy").text()


def test_curves_follow_a_running_run(page, base_url, runs_dir):
    live = runs_dir / "live"
    shutil.copytree(runs_dir / "toy", live, ignore=shutil.ignore_patterns("checkpoints"))
    run_started(live, steps=5)  # this process: alive, so the run shows as running
    page.goto(f"{base_url}/?token={TOKEN}&load=live#curves")  # a new query: a fresh page
    curve = page.locator('#chart path.series[data-run="live"]')
    sync_api.expect(curve).to_have_count(1)
    assert curve.get_attribute("d").count("L") == 1
    with (live / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 2, "time": 2e9, "phase": "train", "reward/mean": 0.9}))
        handle.write("\n")
    page.wait_for_function(
        """() => (document.querySelector('#chart path.series[data-run="live"]')
                  ?.getAttribute("d").match(/L/g) || []).length === 2"""
    )
    sync_api.expect(page.locator('tr[data-run-row="live"] .badge')).to_have_text("running")
