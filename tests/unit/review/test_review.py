"""Reviews: validation, durable storage, and the training data `train` takes from them."""

import json

import pytest

from agentscope_rft.review.store import Review, ReviewError, ReviewStore
from agentscope_rft.review.training import ReviewDataError, load_review_samples, review_use

from ..dashboard.runs_on_disk import write_run


class CharTokenizer:
    """One token per character; end of turn is id 2."""

    eos_token_id = 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run")


def test_thumbs_are_scores_and_incomplete_reviews_are_refused():
    assert Review(kind="rating", rollout_id="r", thumbs="down").score == 0.0
    with pytest.raises(ValueError, match="finite `score`"):
        Review(kind="rating", rollout_id="r", score=float("nan"))
    with pytest.raises(ValueError, match="both `sample_id` and `call`"):
        Review(kind="rating", rollout_id="r", score=1, call=0)
    with pytest.raises(ValueError, match="needs `text`"):
        Review(kind="correction", rollout_id="r", sample_id="s", call=0, text="  ")
    with pytest.raises(ValueError, match="two different episodes"):
        Review(kind="preference", chosen="a", rejected="a")


def test_the_store_keeps_the_latest_review_per_target_and_skips_a_torn_line(run):
    store = ReviewStore(run)
    first = store.add({"kind": "rating", "rollout_id": "s0.0", "score": 0.2})
    store.add({"kind": "preference", "chosen": "s0.0", "rejected": "s0.1"})
    second = store.add({"kind": "rating", "rollout_id": "s0.0", "score": 0.9, "id": "forged"})
    with store.path.open("a") as handle:
        handle.write('{"kind": "rating", "rollout_')
    assert second.id != "forged" and len(store.all()) == 3
    current = store.current()
    assert [r.kind for r in current] == ["rating", "preference"]
    assert current[0].id == second.id and current[0].score == 0.9 and first.id != second.id
    with pytest.raises(ReviewError, match="rollout_id"):
        store.add({"kind": "rating", "score": 1})


def test_ratings_retrain_their_groups_with_the_reviewers_rewards(run):
    store = ReviewStore(run)
    store.add({"kind": "rating", "rollout_id": "s1.1", "score": 5.0})
    store.add({"kind": "rating", "rollout_id": "s2.0", "sample_id": "s2.0:solver:0",
               "call": 0, "score": -1.0})  # fmt: skip
    samples = load_review_samples(run, "rewards", CharTokenizer())
    by_rollout = {s.rollout_id: s for s in samples}
    assert sorted(by_rollout) == ["s1.0", "s1.1", "s2.0", "s2.1"]  # step 0 has no review
    assert by_rollout["s1.1"].reward == 5.0 and by_rollout["s1.0"].reward == 1.0
    assert by_rollout["s1.0"].group == by_rollout["s1.1"].group
    # a call rating lands on the call's last completion token (span [3, 5) -> index 4)
    assert list(by_rollout["s2.0"].token_rewards) == [0, 0, 0, 0, -1.0, 0]
    assert by_rollout["s2.0"].reward == 1.0 and by_rollout["s2.1"].token_rewards is None
    assert all(s.kind == "rl" for s in samples)


def test_a_correction_is_an_sft_sample_on_the_calls_exact_prompt(run):
    ReviewStore(run).add(
        {
            "kind": "correction",
            "rollout_id": "s0.1",
            "sample_id": "s0.1:solver:0",
            "call": 0,
            "text": "OK",
        }
    )
    (sample,) = load_review_samples(run, "sft", CharTokenizer())
    assert list(sample.token_ids) == [5, 6, 7, ord("O"), ord("K"), 2]
    assert list(sample.loss_mask) == [0, 0, 0, 1, 1, 1]
    assert sample.kind == "sft" and sample.task_id == "t0"


def test_preferences_and_corrections_are_dpo_pairs(run):
    store = ReviewStore(run)
    store.add({"kind": "preference", "chosen": "s0.1", "rejected": "s0.0"})
    store.add({"kind": "correction", "rollout_id": "s1.0", "sample_id": "s1.0:solver:0",
               "call": 0, "text": "Z"})  # fmt: skip
    samples = load_review_samples(run, "dpo", CharTokenizer())
    assert [s.kind for s in samples] == ["dpo_chosen", "dpo_rejected"] * 2
    pick, fix = samples[:2], samples[2:]
    assert [s.rollout_id for s in pick] == ["s0.1", "s0.0"]
    assert pick[0].pair_id == pick[1].pair_id != fix[0].pair_id
    assert list(fix[0].token_ids) == [5, 6, 7, ord("Z"), 2]
    # the rejected side: the answer the policy gave, with its end-of-turn token
    assert list(fix[1].token_ids) == [5, 6, 7, 8, 9, 2]
    assert list(fix[1].loss_mask) == [0, 0, 0, 1, 1, 1]


def test_reviews_that_give_no_data_of_the_kind_asked_say_what_would(run, tmp_path):
    with pytest.raises(ReviewDataError, match="has no reviews"):
        load_review_samples(run, "rewards", CharTokenizer())
    ReviewStore(run).add({"kind": "rating", "rollout_id": "s0.0", "score": 1})
    with pytest.raises(ReviewDataError, match="gives sft data; it takes corrections"):
        load_review_samples(run, "sft", CharTokenizer())
    (run / "samples.jsonl").unlink()
    with pytest.raises(ReviewDataError, match=r"monitor\.sample_log: 0"):
        load_review_samples(run, "rewards", CharTokenizer())


def test_a_correction_of_a_call_not_logged_is_an_error(run):
    ReviewStore(run).add(
        {
            "kind": "correction",
            "rollout_id": "s0.0",
            "sample_id": "s0.0:solver:0",
            "call": 3,
            "text": "x",
        }
    )
    with pytest.raises(ReviewDataError, match="call 3 is not in"):
        load_review_samples(run, "sft", CharTokenizer())


def test_what_a_run_takes_follows_its_objective():
    assert review_use("sft", exploring=False) == "sft"
    assert review_use("dpo", exploring=False) == "dpo"
    assert review_use("rl", exploring=False) == "rewards"
    assert review_use("sft_rl_mix", exploring=True) == "sft"


def test_the_review_file_is_plain_jsonl(run):
    ReviewStore(run).add({"kind": "rating", "rollout_id": "s0.0", "thumbs": "up", "comment": "x"})
    (line,) = (run / "reviews.jsonl").read_text().splitlines()
    assert json.loads(line)["score"] == 1.0


def test_a_review_run_config_takes_sft_dpo_or_rl_and_needs_a_reviewed_folder(run):
    from agentscope_rft.config import ConfigError, load_config
    from agentscope_rft.explorer.tasks import TaskSetError
    from agentscope_rft.runtime.preflight import _check_offline_path

    def config(objective, path=run):
        return load_config(
            None,
            [
                "run.mode=offline",
                "offline.format=review",
                f"offline.path={path}",
                f"algorithm.objective={objective}",
            ],
        )

    for objective in ("sft", "dpo", "rl"):
        assert config(objective).offline.format == "review"
    with pytest.raises(ConfigError, match=r"sft \(corrections\), dpo \(pairs\) or rl"):
        config("sft_rl_mix")
    with pytest.raises(TaskSetError, match=r"has no reviews\.jsonl"):
        _check_offline_path(config("rl"))
    ReviewStore(run).add({"kind": "rating", "rollout_id": "s0.0", "score": 1})
    _check_offline_path(config("rl"))


def test_a_review_line_that_is_not_utf8_is_skipped_and_named(tmp_path, caplog):
    store = ReviewStore(tmp_path)
    store.add({"kind": "rating", "rollout_id": "s0.0", "score": 0.2})
    with open(store.path, "ab") as handle:
        handle.write(b'{"kind": "rating", "note": "caf\xe9"}\n')  # a hand edit in Latin-1
    store.add({"kind": "rating", "rollout_id": "s0.1", "score": 0.9})
    with caplog.at_level("WARNING"):
        reviews = store.all()
    assert [r.rollout_id for r in reviews] == ["s0.0", "s0.1"]
    assert "reviews.jsonl: line(s) 2 are not reviews" in caplog.text


def test_a_review_after_a_writer_killed_mid_line_is_kept(run):
    store = ReviewStore(run)
    store.add({"kind": "rating", "rollout_id": "s0.0", "score": 0.2})
    with store.path.open("a") as handle:  # the dashboard killed in the middle of a line
        handle.write('{"kind": "rating", "rollout_id": "s1.0", "sco')
    after = store.add({"kind": "rating", "rollout_id": "s2.0", "score": 0.7})
    assert [(r.rollout_id, r.score) for r in store.all()] == [("s0.0", 0.2), ("s2.0", 0.7)]
    assert store.all()[-1].id == after.id


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"score": 1, "thumbs": "down"}, "give one of them"),
        ({"score": True}, "score: Input should be a valid number"),
        ({"score": "0.5"}, "score: Input should be a valid number"),
        ({"score": 1, "sample_id": "s0.0:solver:0", "call": True}, "call: Input should be"),
        ({"score": 1, "sample_id": "s0.0:solver:0", "call": "0"}, "call: Input should be"),
    ],
)
def test_a_rating_of_the_wrong_type_or_contradicting_itself_is_refused(run, fields, fragment):
    with pytest.raises(ReviewError, match=fragment):
        ReviewStore(run).add({"kind": "rating", "rollout_id": "s0.0", **fields})
    assert ReviewStore(run).all() == []
    agreeing = ReviewStore(run).add(
        {"kind": "rating", "rollout_id": "s0.0", "score": 1, "thumbs": "up"}
    )
    assert ReviewStore(run).all() == [agreeing] and agreeing.score == 1.0


def test_reviews_of_episodes_without_training_samples_are_named_when_training(run, caplog):
    store = ReviewStore(run)
    store.add({"kind": "rating", "rollout_id": "s1.1", "score": 5.0})
    store.add({"kind": "rating", "rollout_id": "eval3.0", "score": 1.0})  # an eval episode
    store.add({"kind": "preference", "chosen": "eval3.0", "rejected": "eval3.1"})
    store.add({"kind": "preference", "chosen": "s0.0", "rejected": "s0.1"})
    with caplog.at_level("WARNING", logger="agentscope_rft.review.training"):
        rated = load_review_samples(run, "rewards", CharTokenizer())
    assert {s.rollout_id for s in rated} == {"s1.0", "s1.1"}
    assert "1 rating review(s) are not trained on" in caplog.text and "eval3.0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentscope_rft.review.training"):
        pairs = load_review_samples(run, "dpo", CharTokenizer())
    assert {s.rollout_id for s in pairs} == {"s0.0", "s0.1"}
    assert "1 preference review(s) are not trained on" in caplog.text
    assert "eval3.0 over eval3.1" in caplog.text


def test_an_episode_rating_is_the_whole_reward_when_the_run_spread_it_over_calls(run):
    """A run with `explorer.reward_spread: last_call` (or emitted step rewards) logs the reward
    as token rewards and 0 as the outcome: the reviewer's score replaces them, not adds to them."""
    lines = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    for line in lines:
        line["token_rewards"] = [0, 0, 0, 0, line["reward"], 0]
        line["reward"] = 0.0
    (run / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    store = ReviewStore(run)
    store.add({"kind": "rating", "rollout_id": "s1.0", "score": 0.0})  # logged reward 1
    store.add({"kind": "rating", "rollout_id": "s1.0", "sample_id": "s1.0:solver:0", "call": 0,
               "score": 0.25})  # fmt: skip
    by_rollout = {s.rollout_id: s for s in load_review_samples(run, "rewards", CharTokenizer())}

    def total(sample):
        return sample.reward + sum(sample.token_rewards or [])

    assert total(by_rollout["s1.0"]) == 0.25  # the score 0, plus the call's 0.25
    assert total(by_rollout["s1.1"]) == 0.0  # unrated: its own spread reward


def test_a_corrected_calls_rejected_side_ends_at_the_end_of_turn_the_call_sampled(run):
    """Call 0 of a two-call sample stopped on its own end-of-turn token (id 2, trained): the
    rejected answer ends there, as the chosen one does, not one template token later."""
    lines = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    lines[0].update(token_ids=[5, 6, 8, 2, 10, 11, 9, 2], loss_mask=[0, 0, 1, 1, 0, 0, 1, 1],
                    logprobs=[0] * 8, advantages=[0] * 8, call_spans=[[2, 4], [6, 8]])  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ReviewStore(run).add({"kind": "correction", "rollout_id": "s0.0",
                          "sample_id": "s0.0:solver:0", "call": 0, "text": "Z"})  # fmt: skip
    chosen, rejected = load_review_samples(run, "dpo", CharTokenizer())
    assert list(chosen.token_ids) == [5, 6, ord("Z"), 2]
    assert list(rejected.token_ids) == [5, 6, 8, 2] and list(rejected.loss_mask) == [0, 0, 1, 1]


def test_a_correction_ends_with_the_templates_end_of_turn_not_the_tokenizers_eos(run):
    # A base model's tokenizer (eos <|endoftext|>) under a ChatML template (turns end with
    # <|im_end|>): the corrected answer must end as the policy's answers do.
    ReviewStore(run).add(
        {
            "kind": "correction",
            "rollout_id": "s1.0",
            "sample_id": "s1.0:solver:0",
            "call": 0,
            "text": "Z",
        }
    )
    (sft,) = load_review_samples(run, "sft", CharTokenizer(), end_of_turn_id=3)
    assert list(sft.token_ids) == [5, 6, 7, ord("Z"), 3]
    chosen, rejected = load_review_samples(run, "dpo", CharTokenizer(), end_of_turn_id=3)
    assert list(chosen.token_ids) == [5, 6, 7, ord("Z"), 3]
    assert list(rejected.token_ids) == [5, 6, 7, 8, 9, 2]  # the policy's own answer as sampled


def test_rated_groups_of_one_episode_are_refused_for_a_group_baseline(run, caplog):
    """Live traffic answers each prompt once: GRPO's group of one has advantage 0, so the run
    says so and names the fixes instead of training on nothing; a batch baseline is fine."""
    from agentscope_rft.algorithms.advantages import GRPOConfig, ReinforcePlusPlusConfig
    from agentscope_rft.review.training import check_rated_groups

    store = ReviewStore(run)
    store.add({"kind": "rating", "rollout_id": "s1.1", "score": 5.0})
    samples = load_review_samples(run, "rewards", CharTokenizer())
    check_rated_groups(run, samples, GRPOConfig())  # a group of two episodes: fine
    alone = [s for s in samples if s.rollout_id == "s1.1"]
    with pytest.raises(ReviewDataError, match=r"one episode.*reinforce_plus_plus"):
        check_rated_groups(run, alone, GRPOConfig())
    check_rated_groups(run, alone, ReinforcePlusPlusConfig())
    with caplog.at_level("WARNING"):
        other = alone[0].__class__(**{**_fields(alone[0]), "group_id": "g2", "rollout_id": "x"})
        check_rated_groups(run, [*samples, other], GRPOConfig())
    assert "1 of 2 rated groups hold one episode" in caplog.text


def _fields(sample):
    return {name: getattr(sample, name) for name in sample.__dataclass_fields__}
