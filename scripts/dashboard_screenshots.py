"""Re-make the dashboard screenshots in docs/images/ from tiny runs trained here (CPU, ~1 min).

    flock /work/heavy.lock .venv/bin/python scripts/dashboard_screenshots.py [--keep /tmp/demo]

Trains the uppercase toy task (tests/integration/toy_app.py) on the tiny random model: one run
and a two-seed sweep (`runs/sweep/seed-<k>`, `sweep.json`), then opens the dashboard in Chromium
(Playwright, `$AGENTSCOPE_RFT_CHROMIUM` or `chromium` on the PATH) and saves the pages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "docs-screenshots-token"


def train_toy(run_dir: Path, tasks: Path, seed: int, lr: float) -> None:
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.local import train

    config = load_config(
        None,
        [
            "model.name_or_path=tiny-random",
            f"workflow={ROOT / 'tests/integration/toy_app.py'}:run",
            f"tasks.train={tasks}",
            f"tasks.eval={tasks}",
            "tasks.eval_limit=4",
            "run.eval_every=4",
            "explorer.group_size=8",
            "explorer.tasks_per_step=4",
            "explorer.sampling.max_tokens=8",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            f"trainer.lr={lr}",
            "run.steps=12",
            f"run.seed={seed}",
            f"explorer.seed={seed}",
            f"run.dir={run_dir}",
            f"run.name={run_dir.name}",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            "monitor.console=false",
        ],
    )
    asyncio.run(train(config, run_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="train into this folder and keep it")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="dashboard-demo-"))
    runs = work / "runs"
    tasks = work / "tasks.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(16)]
    tasks.write_text("".join(lines))
    if not runs.exists():
        train_toy(runs / "toy-lr0.02", tasks, seed=0, lr=2e-2)
        for seed in (0, 1):
            train_toy(runs / "sweep" / f"seed-{seed}", tasks, seed=seed, lr=5e-2)
        (runs / "sweep" / "sweep.json").write_text(
            json.dumps({"seeds": [0, 1], "runs": {"0": "seed-0", "1": "seed-1"}})
        )
    shoot(runs, args.out)
    if args.keep is None:
        shutil.rmtree(work)


def shoot(runs: Path, out: Path) -> None:
    import uvicorn
    from playwright.sync_api import expect, sync_playwright

    from agentscope_rft.dashboard.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(runs, token=TOKEN), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/?token={TOKEN}"
    chromium = os.environ.get("AGENTSCOPE_RFT_CHROMIUM") or shutil.which("chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(url + "#runs")
        expect(page.locator("#runs-table tbody tr[data-run-row]")).to_have_count(3)
        page.screenshot(path=str(out / "dashboard-runs.png"), full_page=True)
        page.click('nav a[data-tab="curves"]')
        page.fill("#smoothing", "0.6")
        page.dispatch_event("#smoothing", "input")
        expect(page.locator("#chart path.band")).to_have_count(1)
        page.screenshot(path=str(out / "dashboard-curves.png"))
        page.click('nav a[data-tab="episodes"]')
        page.select_option("#episode-run", "sweep/seed-1")
        page.select_option("#episode-phase", "train")
        page.fill("#episode-step", "11")
        page.dispatch_event("#episode-step", "change")
        expect(page.locator("#episodes-table tbody tr")).to_have_count(32)
        page.select_option("#episode-sort", "-reward")
        page.screenshot(path=str(out / "dashboard-episodes.png"))
        page.locator("#episodes-table tbody tr").first.click()
        expect(page.locator(".tok.trained").first).to_be_visible()
        page.locator(".call-start").first.click()
        page.screenshot(path=str(out / "dashboard-trajectory.png"), full_page=True)
        browser.close()
    server.should_exit = True
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
