"""The dashboard's HTTP API over hand-written run folders: traversal, broken runs, the token."""

import json
import socket
import urllib.parse

import pytest
from fastapi.testclient import TestClient

from agentscope_rft.dashboard.app import create_app
from agentscope_rft.dashboard.runs import discover_runs
from agentscope_rft.dashboard.server import DashboardError, dashboard_token
from agentscope_rft.monitor.status import run_started

from .runs_on_disk import write_run

TOKEN = "a-token-of-some-length"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "done", status={"state": "ended", "error": None, "steps": 3})
    return root


def client(root, open_reads=True) -> TestClient:
    # A browser on the machine addresses the dashboard as localhost (TestClient's own default
    # Host, `testserver`, is not a loopback name, and open reads refuse it).
    return TestClient(
        create_app(root, token=TOKEN, open_reads=open_reads), base_url="http://localhost:8765"
    )


@pytest.mark.parametrize(
    "host", ["localhost:8765", "127.0.0.1:8765", "[::1]:8765", "app.localhost"]
)
def test_open_reads_serve_loopback_names(runs, host):
    response = client(runs).get("/api/runs", headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("host", ["rebind.attacker.example:8765", "192.168.1.7:8765", "[fe80::1]"])
def test_open_reads_refuse_a_foreign_host_header_unless_it_carries_the_token(runs, host):
    refused = client(runs).get(
        "/api/run/metrics", params={"run_id": "done"}, headers={"Host": host}
    )
    assert refused.status_code == 403
    assert "DNS rebinding" in refused.json()["error"]
    assert host in refused.json()["error"]
    allowed = client(runs).get(
        "/api/run/metrics", params={"run_id": "done"}, headers={"Host": host, **AUTH}
    )
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize(
    "run_id", ["../done", "../../etc", "/etc", "done/../../x", "..", "a\\..\\b"]
)
def test_a_path_outside_the_runs_folder_is_refused(runs, run_id):
    (runs.parent / "secret").mkdir()
    (runs.parent / "secret" / "config.yaml").write_text("run: {steps: 1}\n")
    response = client(runs).get("/api/run/metrics", params={"run_id": run_id})
    assert response.status_code in (403, 404)
    assert "error" in response.json()
    if ".." in run_id or run_id.startswith("/"):
        assert response.status_code == 403
        assert "outside the runs folder" in response.json()["error"]


def test_a_link_out_of_the_runs_folder_is_not_listed(runs, tmp_path):
    outside = write_run(tmp_path / "elsewhere")
    (runs / "link").symlink_to(outside)
    assert [r.id for r in discover_runs(runs)] == ["done"]
    response = client(runs).get("/api/run/episodes", params={"run_id": "link"})
    assert response.status_code == 404


def test_an_unknown_run_is_a_clear_404(runs):
    response = client(runs).get("/api/run/episodes", params={"run_id": "nope"})
    assert response.status_code == 404
    assert "no run 'nope'" in response.json()["error"]


def test_a_missing_runs_folder_lists_nothing(tmp_path):
    response = client(tmp_path / "absent").get("/api/runs")
    assert response.status_code == 200 and response.json()["runs"] == []


def test_a_malformed_run_is_listed_with_its_error_and_the_others_still_show(runs):
    bad = runs / "bad"
    bad.mkdir()
    (bad / "config.yaml").write_text("{{{ not yaml")
    (bad / "metrics.jsonl").write_text('{"step": 0, "phase": "train"}\nnot json\n{"step": 1}\n')
    (bad / "rollouts.jsonl").write_text("garbage\n")
    c = client(runs)
    listed = {r["id"]: r for r in c.get("/api/runs").json()["runs"]}
    assert set(listed) == {"bad", "done"}
    assert "line 2" in listed["bad"]["error"] and listed["done"]["error"] is None
    metrics = c.get("/api/run/metrics", params={"run_id": "bad"})
    assert metrics.status_code == 422 and "line 2: not valid JSON" in metrics.json()["error"]
    assert c.get("/api/run/episodes", params={"run_id": "bad"}).json()["episodes"] == []
    missing = c.get("/api/run/episode", params={"run_id": "bad", "rollout_id": "x"})
    assert missing.status_code == 404 and "no episode 'x'" in missing.json()["error"]


def test_an_empty_run_folder_without_metrics_shows_zero_steps(runs):
    (runs / "fresh").mkdir()
    (runs / "fresh" / "config.yaml").write_text("run: {steps: 5}\n")
    fresh = next(r for r in client(runs).get("/api/runs").json()["runs"] if r["id"] == "fresh")
    assert fresh["steps_done"] == 0 and fresh["error"] is None and fresh["status"] == "stopped"


def test_a_half_written_last_metrics_line_is_skipped(runs):
    with (runs / "done" / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "time": 1004.0, "phase": "train", "rew')
    c = client(runs)
    records = c.get("/api/run/metrics", params={"run_id": "done"}).json()["records"]
    assert [r["step"] for r in records if r["phase"] == "train"] == [0, 1, 2]
    done = c.get("/api/runs").json()["runs"][0]
    assert done["steps_done"] == 3 and done["error"] is None


def test_a_review_without_the_token_is_refused_and_not_stored(runs):
    c = client(runs)
    review = {"kind": "rating", "rollout_id": "s0.0", "score": 1}
    refused = c.post("/api/run/reviews", params={"run_id": "done"}, json=review)
    assert refused.status_code == 401 and "token" in refused.json()["error"]
    wrong = c.post(
        "/api/run/reviews",
        params={"run_id": "done"},
        json=review,
        headers={"Authorization": "Bearer wrong-token-of-some-length"},
    )
    assert wrong.status_code == 401
    assert not (runs / "done" / "reviews.jsonl").exists()
    stored = c.post("/api/run/reviews", params={"run_id": "done"}, json=review, headers=AUTH)
    assert stored.status_code == 201 and stored.json()["score"] == 1.0
    listed = c.get("/api/run/reviews", params={"run_id": "done"}).json()["reviews"]
    assert [r["id"] for r in listed] == [stored.json()["id"]]


def test_a_bad_review_is_a_clear_422(runs):
    c = client(runs)
    bad = c.post(
        "/api/run/reviews", params={"run_id": "done"}, json={"kind": "rating"}, headers=AUTH
    )
    assert bad.status_code == 422 and "needs `rollout_id`" in bad.json()["error"]
    unknown = c.post(
        "/api/run/reviews",
        params={"run_id": "done"},
        json={"kind": "rating", "rollout_id": "s0.0", "score": 1, "stars": 5},
        headers=AUTH,
    )
    assert unknown.status_code == 422 and "stars" in unknown.json()["error"]
    not_json = c.post("/api/run/reviews", params={"run_id": "done"}, content=b"{oops", headers=AUTH)
    assert not_json.status_code == 400


@pytest.mark.parametrize(
    ("review", "fragment"),
    [
        ({"kind": "rating", "rollout_id": "s9.9", "score": 1}, "rollout_id: no episode 's9.9'"),
        ({"kind": "rating", "rollout_id": "x" * 100_000, "score": 1}, "rollout_id: no episode"),
        ({"kind": "preference", "chosen": "s0.0", "rejected": "gone"}, "rejected: no episode"),
        ({"kind": "preference", "chosen": "s0.0", "rejected": "s1.1"}, "different tasks"),
        (
            {"kind": "rating", "rollout_id": "s0.0", "sample_id": "s0.1:solver:0", "call": 0,
             "score": 1},
            "sample_id: no sample",
        ),
        (
            {"kind": "correction", "rollout_id": "s0.0", "sample_id": "s0.0:solver:0", "call": 1,
             "text": "4"},
            "has 1 call(s)",
        ),
    ],
)  # fmt: skip
def test_a_review_of_what_the_run_does_not_hold_is_refused_and_not_stored(runs, review, fragment):
    c = client(runs)
    refused = c.post("/api/run/reviews", params={"run_id": "done"}, json=review, headers=AUTH)
    assert refused.status_code == 422 and fragment in refused.json()["error"], refused.text
    assert not (runs / "done" / "reviews.jsonl").exists()
    pair = {"kind": "preference", "chosen": "s1.0", "rejected": "s1.1"}  # one task: stored
    assert c.post("/api/run/reviews", params={"run_id": "done"}, json=pair, headers=AUTH).is_success


def test_a_missing_or_mistyped_query_parameter_is_a_400_in_the_dashboards_error_shape(runs):
    c = client(runs)
    missing = c.get("/api/run/episodes")
    assert missing.status_code == 400
    assert missing.json() == {"error": "bad query parameter(s): run_id: required"}
    mistyped = c.get("/api/run/episodes", params={"run_id": "done", "step": "two"})
    assert mistyped.status_code == 400 and "step:" in mistyped.json()["error"]
    unwritten = c.post("/api/run/reviews", json={}, headers=AUTH)
    assert unwritten.status_code == 400 and "run_id" in unwritten.json()["error"]


def test_beyond_loopback_every_read_needs_the_token(runs):
    c = client(runs, open_reads=False)
    assert c.get("/api/runs").status_code == 401
    assert c.get("/api/runs", headers=AUTH).status_code == 200
    assert c.get("/api/runs", params={"token": TOKEN}).status_code == 200
    assert c.get("/").status_code == 200  # the page itself holds no data


def test_a_non_loopback_bind_needs_an_explicit_token(monkeypatch):
    monkeypatch.delenv("AGENTSCOPE_RFT_DASHBOARD_TOKEN", raising=False)
    with pytest.raises(DashboardError, match="--token"):
        dashboard_token("0.0.0.0", None)
    with pytest.raises(DashboardError, match="16 characters"):
        dashboard_token("127.0.0.1", "short")
    assert len(dashboard_token("127.0.0.1", None)) >= 16
    assert dashboard_token("0.0.0.0", TOKEN) == TOKEN


def test_assets_ship_with_the_package_and_reference_no_cdn(runs):
    c = client(runs)
    page = c.get("/").text
    for name in ("app.js", "style.css"):
        body = c.get(f"/static/{name}")
        assert body.status_code == 200 and len(body.text) > 1000
        text = body.text.replace("http://www.w3.org/2000/svg", "")  # a namespace, not a fetch
        assert "http://" not in text and "https://" not in text
    assert "https://" not in page and "/static/app.js" in page
    assert c.get("/static/../app.py").status_code == 404


def test_statuses_are_derived_from_the_status_file(runs):
    host = socket.gethostname()
    write_run(runs / "stopped", done=2, status={"state": "ended", "error": None})
    write_run(runs / "crashed", done=1, status={"state": "ended", "error": "OSError: disk"})
    write_run(runs / "killed", done=1, status={"state": "running", "pid": 2**22 + 7, "host": host})
    write_run(runs / "live", done=1, status={"state": "running", "pid": 1, "host": host})
    listed = {r["id"]: r for r in client(runs).get("/api/runs").json()["runs"]}
    assert {k: v["status"] for k, v in listed.items()} == {
        "done": "finished",
        "stopped": "stopped",
        "crashed": "failed",
        "killed": "failed",
        "live": "running",
    }
    assert "disk" in listed["crashed"]["status_detail"]


def test_sweeps_group_their_seed_runs_and_best_and_health_are_read(runs):
    sweep = runs / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(
        json.dumps({"seeds": [0, 1], "runs": {"0": "seed-0", "1": "seed-1"}})
    )
    (sweep / "config.yaml").write_text("run: {steps: 3}\n")  # a sweep's own files: not a run
    event = dict(step=1, time=1.0, rule="entropy", action="warn", metric="entropy", value=0.1,
                 threshold=0.2, message="entropy low", rolled_back_to=None)  # fmt: skip
    write_run(sweep / "seed-0", seed=0, health=[event])
    write_run(sweep / "seed-1", seed=1)
    (sweep / "seed-1" / "best.json").write_text(
        json.dumps({"step": 2, "metric": "val/reward/mean", "value": 0.9, "mode": "max"})
    )
    c = client(runs)
    listed = {r["id"]: r for r in c.get("/api/runs").json()["runs"]}
    assert sorted(listed) == ["done", "sweep/seed-0", "sweep/seed-1"]
    assert listed["sweep/seed-0"]["group"] == "sweep" and listed["sweep/seed-1"]["seed"] == 1
    assert listed["sweep/seed-1"]["best"]["value"] == 0.9
    assert listed["sweep/seed-0"]["best"] == {
        "step": 3, "metric": "eval/reward/mean", "value": 0.5, "mode": "max", "source": "metrics"
    }  # fmt: skip
    assert listed["sweep/seed-0"]["health_events"] == 1
    metrics = c.get("/api/run/metrics", params={"run_id": "sweep/seed-0"}).json()
    assert metrics["health"][0]["message"] == "entropy low"


def test_an_episode_comes_with_its_samples_and_its_task_siblings(runs):
    detail = (
        client(runs).get("/api/run/episode", params={"run_id": "done", "rollout_id": "s1.0"}).json()
    )
    assert detail["episode"]["task_id"] == "t1"
    assert [s["sample_id"] for s in detail["samples"]] == ["s1.0:solver:0"]
    # The model cannot be loaded here: token ids stand in for the text.
    assert detail["samples"][0]["tokens"][:2] == ["<5>", "<6>"]
    assert [e["rollout_id"] for e in detail["same_task"]] == ["s1.1"]


def test_the_export_carries_each_review_with_its_episode(runs):
    c = client(runs)
    c.post(
        "/api/run/reviews",
        params={"run_id": "done"},
        json={"kind": "preference", "chosen": "s0.0", "rejected": "s0.1", "comment": "clearer"},
        headers=AUTH,
    )
    text = c.get("/api/run/reviews.jsonl", params={"run_id": "done"}).text
    (line,) = [json.loads(x) for x in text.splitlines()]
    assert line["kind"] == "preference" and line["comment"] == "clearer"
    assert line["chosen_episode"]["reward"] == 1.0 and line["rejected_episode"]["task_id"] == "t0"


def test_a_resumed_runs_re_explored_episodes_show_once_as_last_written(runs):
    done = runs / "done"
    for name, key in (("rollouts.jsonl", "rollout_id"), ("samples.jsonl", "sample_id")):
        lines = (done / name).read_text().splitlines()
        again = json.loads(lines[-1]) | {"reward": 0.25}
        assert key in again
        with (done / name).open("a") as handle:
            handle.write(json.dumps(again) + "\n")
    c = client(runs)
    episodes = c.get("/api/run/episodes", params={"run_id": "done"}).json()["episodes"]
    assert len(episodes) == 6 and episodes[-1]["reward"] == 0.25
    detail = c.get("/api/run/episode", params={"run_id": "done", "rollout_id": "s2.1"}).json()
    assert [s["reward"] for s in detail["samples"]] == [0.25]


def test_the_command_refuses_an_open_bind_without_a_token_and_exports_reviews(runs, monkeypatch):
    from typer.testing import CliRunner

    from agentscope_rft.cli import app
    from agentscope_rft.review.store import ReviewStore

    monkeypatch.delenv("AGENTSCOPE_RFT_DASHBOARD_TOKEN", raising=False)
    refused = CliRunner().invoke(app, ["dashboard", str(runs), "--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "give it a token" in refused.output
    missing = CliRunner().invoke(app, ["dashboard", str(runs / "nope")])
    assert missing.exit_code == 2 and "no runs folder" in missing.output
    ReviewStore(runs / "done").add({"kind": "rating", "rollout_id": "s1.1", "thumbs": "up"})
    out = runs.parent / "reviews.jsonl"
    exported = CliRunner().invoke(
        app, ["dashboard", str(runs / "done"), "--export-reviews", str(out)]
    )
    assert exported.exit_code == 0, exported.output
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["score"] == 1.0 and line["rollout_id_episode"]["task_id"] == "t1"


def test_a_huge_review_is_refused_and_not_stored(runs):
    c = client(runs)
    huge = {"kind": "correction", "rollout_id": "s0.0", "sample_id": "s0.0:solver:0", "call": 0,
            "text": "A" * 5_000_000}  # fmt: skip
    refused = c.post("/api/run/reviews", params={"run_id": "done"}, json=huge, headers=AUTH)
    assert refused.status_code == 413 and "over 1024 KiB" in refused.json()["error"]
    long = {**huge, "text": "A" * 200_000}  # under the body limit, over the answer's
    refused = c.post("/api/run/reviews", params={"run_id": "done"}, json=long, headers=AUTH)
    assert refused.status_code == 422 and "text" in refused.json()["error"]
    assert not (runs / "done" / "reviews.jsonl").exists()
    fine = {**huge, "text": "4"}
    assert c.post("/api/run/reviews", params={"run_id": "done"}, json=fine, headers=AUTH).is_success


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("run: [unclosed\n", "config.yaml is unreadable (line 2: expected ',' or ']'"),
        ("- a list\n", "not a YAML mapping"),
    ],
)
def test_a_run_with_a_broken_config_shows_the_error_in_the_runs_list(runs, text, fragment):
    (runs / "done" / "config.yaml").write_text(text)
    (runs / "done" / "status.json").write_text(json.dumps({"state": "ended", "error": None}))
    done = client(runs).get("/api/runs").json()["runs"][0]
    assert fragment in (done["error"] or "") and done["steps_done"] == 3
    assert done["status_detail"] == "stopped after 3 steps: resume with --resume"
    ended = {"state": "ended", "error": None, "steps": 3}  # status.json knows run.steps too
    (runs / "done" / "status.json").write_text(json.dumps(ended))
    done = client(runs).get("/api/runs").json()["runs"][0]
    assert done["status"] == "finished" and done["total_steps"] == 3


@pytest.mark.parametrize("where", ["missing/folder/out.jsonl", "."])
def test_exporting_reviews_to_a_path_that_cannot_be_written_is_one_clear_error(runs, where):
    from typer.testing import CliRunner

    from agentscope_rft.cli import app

    out = runs.parent / where
    result = CliRunner().invoke(
        app, ["dashboard", str(runs / "done"), "--export-reviews", str(out)]
    )
    assert result.exit_code == 2, result.output
    unwrapped = "".join(result.output.split())  # the error is wrapped to the terminal width
    assert f"cannotwrite{out}" in unwrapped and "Traceback" not in result.output


def test_a_samples_log_with_bytes_that_are_not_utf8_spoils_only_their_line(runs):
    with (runs / "done" / "samples.jsonl").open("ab") as handle:
        handle.write(b'\xff\xfe{"sample_id": "junk"}\n')
    c = client(runs)
    episode = c.get("/api/run/episode", params={"run_id": "done", "rollout_id": "s0.0"})
    assert episode.status_code == 200 and len(episode.json()["samples"]) == 1
    review = {"kind": "rating", "rollout_id": "s0.0", "sample_id": "s0.0:solver:0", "call": 0,
              "score": 1}  # fmt: skip
    stored = c.post("/api/run/reviews", params={"run_id": "done"}, json=review, headers=AUTH)
    assert stored.status_code == 201, stored.text


def test_a_token_that_a_url_or_header_would_not_carry_is_refused_and_a_bad_one_is_a_401(runs):
    for token in ("pässwort-lang-genug-1", "has spaces in it 1234", "a&b=c#d%e+f?g/h-12"):
        with pytest.raises(DashboardError, match="letters, digits"):
            dashboard_token("127.0.0.1", token)
    assert dashboard_token("127.0.0.1", "Ok.token_with~dash-1") == "Ok.token_with~dash-1"
    c = client(runs)
    review = {"kind": "rating", "rollout_id": "s0.0", "score": 1}
    in_query = {"params": {"run_id": "done", "token": "été-été-été-été-été"}}
    in_header = {"params": {"run_id": "done"}, "headers": {"X-Dashboard-Token": "été".encode()}}
    for given in (in_query, in_header):
        refused = c.post("/api/run/reviews", json=review, **given)
        assert refused.status_code == 401 and "token" in refused.json()["error"]


@pytest.mark.parametrize(
    "path", ["/static/..%2f..%2fapp.py", "/static/app.py", "/static/%2e%2e/runs.py", "/nope"]
)
def test_no_file_outside_the_assets_is_served_and_the_404_is_in_the_dashboards_shape(runs, path):
    response = client(runs).get(path)
    assert response.status_code == 404 and "error" in response.json()
    assert "import" not in response.text


def test_log_lines_with_fields_of_the_wrong_type_do_not_take_the_run_down(runs):
    """Valid JSON of the wrong shape (a hand edit): the run's other episodes still show."""
    with (runs / "done" / "rollouts.jsonl").open("a") as handle:
        lines = [
            {"rollout_id": ["a list"]},
            {"rollout_id": "odd", "calls": {"agent": "x"}, "error": 5},
            {"rollout_id": "odder", "calls": [1, {"completion_tokens": "2"}]},
        ]
        handle.write("".join(json.dumps(line) + "\n" for line in lines))
    with (runs / "done" / "samples.jsonl").open("a") as handle:
        handle.write(json.dumps({"rollout_id": "s0.0", "sample_id": ["a list"]}) + "\n")
    c = client(runs)
    listed = c.get("/api/run/episodes", params={"run_id": "done"})
    assert listed.status_code == 200, listed.text
    by_id = {e["rollout_id"]: e for e in listed.json()["episodes"]}
    assert by_id["odd"]["calls"] == 0 and by_id["odd"]["error"] == "5"
    assert by_id["odder"]["calls"] == 1 and by_id["odder"]["length"] == 0 and "s0.0" in by_id
    for rollout_id in ("odd", "s0.0"):
        episode = c.get("/api/run/episode", params={"run_id": "done", "rollout_id": rollout_id})
        assert episode.status_code == 200 and isinstance(episode.json()["episode"]["calls"], list)
    review = {"kind": "rating", "rollout_id": "s0.0", "score": 1}
    assert c.post(
        "/api/run/reviews", params={"run_id": "done"}, json=review, headers=AUTH
    ).is_success


@pytest.mark.parametrize("name", ["实验", 'a"b', "plain"])
def test_the_reviews_of_a_run_with_any_folder_name_download(runs, name):
    write_run(runs / name)
    response = client(runs).get("/api/run/reviews.jsonl", params={"run_id": name})
    assert response.status_code == 200
    disposition = response.headers["content-disposition"]
    assert disposition.count('"') == 2 and disposition.isascii()
    assert urllib.parse.quote(f"{name}-reviews.jsonl", safe="") in disposition


def test_a_host_that_does_not_resolve_is_named_not_blamed_on_the_port(runs):
    from typer.testing import CliRunner

    from agentscope_rft.cli import app

    result = CliRunner().invoke(
        app, ["dashboard", str(runs), "--host", "no-such-host.invalid", "--token", TOKEN]
    )
    unwrapped = " ".join(result.output.split())
    assert result.exit_code == 2 and "--host no-such-host.invalid" in unwrapped, result.output
    assert "pick another --port" not in unwrapped


@pytest.mark.parametrize("written", ["", '{"step": 0, "time": 1000.0, "pha'])
def test_a_run_that_has_not_logged_its_first_step_yet_is_not_an_error(runs, written):
    """`metrics.jsonl` exists from the run's start; its first line comes after the first step."""
    fresh = runs / "fresh"
    fresh.mkdir()
    (fresh / "config.yaml").write_text("run: {steps: 5}\n")
    (fresh / "metrics.jsonl").write_text(written)
    run_started(fresh, steps=5)  # this process: alive
    c = client(runs)
    listed = next(r for r in c.get("/api/runs").json()["runs"] if r["id"] == "fresh")
    assert listed["error"] is None and listed["status"] == "running" and listed["steps_done"] == 0
    metrics = c.get("/api/run/metrics", params={"run_id": "fresh"})
    assert metrics.status_code == 200 and metrics.json()["records"] == []
    (fresh / "metrics.jsonl").write_text("not json\n")  # a whole line that is wrong still is
    assert c.get("/api/run/metrics", params={"run_id": "fresh"}).status_code == 422


def test_a_review_that_cannot_be_written_is_a_clear_error(runs):
    (runs / "done" / "reviews.jsonl").mkdir()  # stands for a read-only folder (tests run as root)
    review = {"kind": "rating", "rollout_id": "s0.0", "score": 1}
    response = client(runs).post(
        "/api/run/reviews", params={"run_id": "done"}, json=review, headers=AUTH
    )
    assert response.status_code == 500
    assert "review not stored: cannot write" in response.json()["error"]
