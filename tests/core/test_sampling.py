"""dspark/sampling.py: logits -> probabilities -> tokens, hand-worked and edge cases, nucleus = its sorted
definition, and a chi-square check of the sampler (unusable temperatures: the lab's parser refuses them,
tests/lab/test_cli.py)."""

from __future__ import annotations

import math

import pytest
import torch

from dspark.sampling import SamplingParams, draw_token, nucleus, probabilities, sample, sample_from_probs


def test_temperature_one_is_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(probabilities(logits, SamplingParams()), torch.softmax(logits, -1))


def test_greedy_is_one_hot_and_ties_go_to_lowest_id():
    probs = probabilities(torch.tensor([[0.5, 2.0, 2.0, 1.0]]), SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_hand_worked():
    probs = probabilities(torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3])), SamplingParams(top_k=2))
    torch.testing.assert_close(probs, torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    # sorted: 0.4, 0.3, 0.2, 0.1 -> 0.4 + 0.3 = 0.7 >= 0.65, so two tokens survive
    probs = probabilities(logits, SamplingParams(top_p=0.65))
    torch.testing.assert_close(probs, torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))
    # a tiny p still keeps the single best token
    assert probabilities(logits, SamplingParams(top_p=1e-6)).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_inverse_cdf_hand_worked():
    probs = torch.tensor([0.25, 0.0, 0.5, 0.25])
    u = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.999999])
    got = sample_from_probs(probs.expand(6, 4), u)
    assert got.tolist() == [0, 0, 2, 2, 3, 3]


def test_zero_probability_tokens_are_never_sampled():
    probs = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0])
    u = torch.tensor([0.0, 0.3, 0.2999999, 1 - 1e-7, 0.9999999999])
    assert set(sample_from_probs(probs.expand(5, 5), u).tolist()) <= {1, 3}


def test_sampling_matches_distribution_chi_square():
    probs = torch.tensor([0.05, 0.15, 0.3, 0.5])
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    draws = sample(probs.expand(n, 4), gen)
    counts = torch.bincount(draws, minlength=4).double()
    expected = probs.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_same_generator_seed_same_tokens():
    probs = torch.softmax(torch.randn(8, 50), -1)
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert math.isclose(float(probs.sum()), 8.0, rel_tol=1e-5)


def test_draw_token_is_the_inverse_cdf_draw():
    """At temperature 0 `draw_token` skips the CDF and takes the argmax; the inverse-CDF draw on the same
    one-hot rows gives the same ids for any uniform (0 and just below 1 included), ties in the logits too.
    At T = 1 it is `sample_from_probs` itself."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 50), generator=g).float()  # many tied maxima
    uniforms = torch.cat([torch.zeros(1), torch.full((1,), 1 - 2**-24), torch.rand(62, generator=g)])
    for params in (SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=5)):
        probs = probabilities(logits, params)
        assert torch.equal(draw_token(probs, uniforms, params), sample_from_probs(probs, uniforms))


def test_sampling_a_distribution_still_works():
    probs = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert sample(probs, torch.Generator().manual_seed(0)).tolist() == [2, 0]


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
def test_nucleus_equals_the_sorted_definition(top_p):
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 5, 3000) * torch.rand(4, 5, 1) * 8, -1)
    ranked, order = probs.sort(-1, descending=True)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, ranked.cumsum(-1) - ranked >= top_p)
    expected = probs.masked_fill(drop, 0)
    expected = expected / expected.sum(-1, keepdim=True)
    for first in (2, 256, 5000):  # rows wider than `first` take the full sort
        assert torch.equal(nucleus(probs, top_p, first) > 0, expected > 0)
        torch.testing.assert_close(nucleus(probs, top_p, first), expected)
