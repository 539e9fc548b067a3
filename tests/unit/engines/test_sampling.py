import math

import torch

from agentscope_rft.engines.sampling import sample_next
from agentscope_rft.types import SamplingParams


def test_greedy_reports_unscaled_logprob():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    out = sample_next(logits, [SamplingParams(temperature=0.0)], [None])
    assert out.token_ids == [1]
    expected = 3.0 - math.log(math.exp(1) + math.exp(3) + math.exp(2))
    assert math.isclose(out.logprobs[0], expected, rel_tol=1e-6)


def test_temperature_scales_the_sampled_distribution():
    # probs at T=0.5 over logits [0, ln 3]: [1, 9] / 10 -> token 1 has log(0.9)
    logits = torch.tensor([[0.0, math.log(3.0)]])
    gen = torch.Generator().manual_seed(0)
    seen = {}
    for _ in range(50):
        out = sample_next(logits, [SamplingParams(temperature=0.5)], [gen])
        seen[out.token_ids[0]] = out.logprobs[0]
    assert math.isclose(seen[1], math.log(0.9), rel_tol=1e-5)
    assert math.isclose(seen[0], math.log(0.1), rel_tol=1e-5)


def test_top_k_renormalizes_over_kept_tokens():
    # softmax over the top-2 logits [2, 1]: e^2/(e^2+e) -> log = 2 - log(e^2 + e)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        out = sample_next(logits, [SamplingParams(top_k=2)], [gen])
        assert out.token_ids[0] in (0, 1)
        expected = logits[0, out.token_ids[0]].item() - math.log(math.e**2 + math.e)
        assert math.isclose(out.logprobs[0], expected, rel_tol=1e-5)


def test_top_p_keeps_smallest_set_reaching_p():
    # probs [0.5, 0.3, 0.2]; top_p=0.6 keeps {0, 1} (mass before token 1 is 0.5 < 0.6)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    gen = torch.Generator().manual_seed(2)
    tokens = set()
    for _ in range(60):
        out = sample_next(logits, [SamplingParams(top_p=0.6)], [gen])
        tokens.add(out.token_ids[0])
        p = {0: 0.5 / 0.8, 1: 0.3 / 0.8}[out.token_ids[0]]
        assert math.isclose(out.logprobs[0], math.log(p), rel_tol=1e-5)
    assert tokens == {0, 1}


def test_rows_use_their_own_settings_and_seeds():
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(seed=5), SamplingParams(top_k=1)]
    a = sample_next(logits, params, [None, torch.Generator().manual_seed(5), None])
    b = sample_next(logits, params, [None, torch.Generator().manual_seed(5), None])
    assert a.token_ids == b.token_ids
    assert a.token_ids[0] == int(logits[0].argmax())
    assert a.token_ids[2] == int(logits[2].argmax())
    assert math.isclose(a.logprobs[2], 0.0, abs_tol=1e-6)  # top_k=1: probability 1


def test_top_logprobs_come_from_the_same_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    out = sample_next(logits, [SamplingParams(temperature=0.0, top_logprobs=2)], [None])
    top = out.top_logprobs[0]
    assert [t for t, _ in top] == [2, 1]
    assert math.isclose(top[0][1], out.logprobs[0], rel_tol=1e-6)


def test_sampled_tokens_follow_the_distribution_and_skip_removed_tokens():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.clamp_min(1e-30).log().expand(4000, -1).clone()
    logits[:, 4] = -float("inf")  # probability 0: never drawn
    params = [SamplingParams(temperature=1.0, top_k=3)] * len(logits)  # top-k drops token 3
    generator = torch.Generator().manual_seed(0)
    out = sample_next(logits, params, [generator] * len(logits))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=5).float() / len(logits)
    kept = probs[:3] / probs[:3].sum()
    torch.testing.assert_close(counts[:3], kept, atol=0.03, rtol=0)
    assert counts[3] == 0 and counts[4] == 0
    expected = kept.log()[torch.tensor(out.token_ids)]
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-5, rtol=0)
