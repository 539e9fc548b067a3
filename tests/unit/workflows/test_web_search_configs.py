"""The web-search example's configs validate, and their workflows load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.api import load_workflow
from agentscope_rft.config import load_config
from environments.search.env import DATA_DIR, SPLITS, load_tasks
from environments.search.splits import check_disjoint
from workflows.search_agent import DEMO_TASKS

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "web_search"


def test_cpu_config_validates_and_its_app_loads() -> None:
    config = load_config(EXAMPLE / "config.yaml")
    assert config.engine.type == "embedded" and config.trainer.type == "torch"
    assert config.explorer.seed is not None  # the embedded engine takes seeded requests
    assert config.model.chat_template is not None
    assert Path(config.model.chat_template).is_file()
    assert load_workflow(config.workflow or "").name == "search_agent"


def test_cpu_config_trains_mixed_validates_on_val_and_never_reads_test() -> None:
    config = load_config(EXAMPLE / "config.yaml")
    splits = {"train": config.tasks.train, "val": config.tasks.val, "test": config.tasks.eval}
    assert {name: Path(path or "").name for name, path in splits.items()} == {
        "train": "train.jsonl",
        "val": "val.jsonl",
        "test": "test.jsonl",
    }
    rows = {name: load_tasks(path or "") for name, path in splits.items()}
    assert check_disjoint(rows) == []
    # Question types mixed from the first step; a validation slice stratified by type.
    assert config.tasks.shuffle is True
    assert config.tasks.stratify_field == "type" and config.tasks.val_limit is not None
    assert all("type" in row for row in rows["val"])
    # the checkpoint is chosen on the validation rewards of the counted types alone
    assert config.run.best_metric == [
        "val/reward/by_type/single_hop",
        "val/reward/by_type/two_hop",
    ]
    assert {"single_hop", "two_hop"} <= {row["type"] for row in rows["val"]}
    assert config.tasks.eval_limit is None  # the test split is only for `explore --split test`


def test_demonstration_pages_are_reserved_from_every_split() -> None:
    manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    titles = {title for queries, _ in DEMO_TASKS.values() for title in queries}
    assert titles <= set(manifest["reserved"])
    questions = {row["question"] for split in SPLITS for row in load_tasks(split)}
    assert not questions & set(DEMO_TASKS)


def test_gpu_recipe_validates_with_search_r1_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(EXAMPLE / "config_gpu.yaml")
    assert config.engine.type == "vllm" and config.trainer.type == "verl"
    assert 5 <= config.explorer.group_size <= 8
    assert config.trainer.lr == pytest.approx(1e-6)
    assert config.explorer.sampling.max_tokens == 500
    # The corpus comes from $SEARCH_CORPUS; a missing file is reported when the app loads.
    monkeypatch.setenv("SEARCH_CORPUS", "/nonexistent/wiki-18.jsonl")
    with pytest.raises(Exception, match=r"wiki-18.jsonl does not exist"):
        load_workflow(config.workflow or "")
    monkeypatch.delenv("SEARCH_CORPUS")
    with pytest.raises(Exception, match=r"set SEARCH_CORPUS to a wiki-18"):
        load_workflow(config.workflow or "")
    # The tasks are Search-R1's parquet files, not the generated ones: preflight names them.
    assert config.tasks.train is not None and config.tasks.train.endswith(".parquet")
    assert not Path(config.tasks.train).exists()


def test_the_warm_start_reads_training_questions_only_and_ends_at_a_validation() -> None:
    config = load_config(EXAMPLE / "config.yaml")
    assert config.offline.path is not None and 0 < config.offline.warmup_steps < config.run.steps
    demos = [json.loads(line) for line in Path(config.offline.path).read_text().splitlines()]
    train_ids = {task["id"] for task in load_tasks("train")}
    assert {demo["id"] for demo in demos} <= train_ids  # no validation or test question
    assert config.offline.warmup_steps * config.offline.batch_size <= len(demos)
    # The validation after the warm-up shows what SFT alone reached, before any RL step.
    assert config.offline.warmup_steps % config.run.eval_every == 0


def test_the_sft_control_differs_from_the_rl_arm_only_in_the_rl_weight() -> None:
    rl = load_config(EXAMPLE / "config.yaml").model_dump(mode="json")
    control = load_config(EXAMPLE / "config_sft_control.yaml").model_dump(mode="json")
    assert (rl["algorithm"].pop("objective"), control["algorithm"].pop("objective")) == (
        "rl",
        "sft_rl_mix",
    )
    mix = control["algorithm"].pop("sft_mix")  # loss = 0 x RL + 1 x the warm-up's plain SFT
    assert (mix["mu_peak"], mix["mu_valley"], mix["phi_weighting"]) == (1.0, 1.0, False)
    rl["algorithm"].pop("sft_mix")  # unused by objective rl
    assert (rl["run"].pop("name"), control["run"].pop("name")) == (
        "web_search",
        "web_search_sft_control",
    )
    assert rl == control  # the same tasks, demonstrations, steps, schedule and validation


def test_gpu_recipe_reads_search_r1_merged_parquet_as_published(tmp_path: Path) -> None:
    # nq_hotpotqa_train.parquet concatenates FlashRAG's NQ and HotpotQA, each numbered from
    # train_0: the recipe's id columns tell them apart, and the rows' gold answers are read.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentscope_rft.explorer.tasks import load_tasks as load_task_file
    from workflows.search_reward import gold_answers

    def row(source: str, question: str, golds: list[str]) -> dict:
        return {
            "id": "train_0",
            "question": question,
            "golden_answers": golds,
            "data_source": source,
            "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
            "extra_info": {"split": "train", "index": 0},
        }

    path = tmp_path / "nq_hotpotqa_train.parquet"
    rows = [row("nq", "who is moses' brother?", ["Aaron"]), row("hotpotqa", "q?", ["a", "b"])]
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = load_config(EXAMPLE / "config_gpu.yaml")
    tasks = load_task_file(
        path, id_field=config.tasks.id_field, required_fields=config.tasks.required_fields
    )
    assert [task.id for task in tasks] == ["nq/train_0", "hotpotqa/train_0"]
    assert [gold_answers(task.data) for task in tasks] == [["Aaron"], ["a", "b"]]


def test_gpu_recipe_requires_its_real_question_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_rft.explorer.tasks import TaskSetError
    from agentscope_rft.runtime.preflight import preflight

    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"Aaron\\"\\nAaron is a prophet."}\n')
    monkeypatch.setenv("SEARCH_CORPUS", str(corpus))
    with pytest.raises(
        TaskSetError,
        match=r"nq_hotpotqa_train.parquet does not exist \(tasks.train\): .*--set tasks.train=",
    ):
        preflight(load_config(EXAMPLE / "config_gpu.yaml"))
