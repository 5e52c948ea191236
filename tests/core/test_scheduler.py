"""dspark/scheduler.py: survival = cumulative product (STS keeps order), Algorithm 1 = brute force on small cases,
prefixes of the greedy path, the async variant and the baselines, policies that need confidences refuse drafters
without them, and end-to-end losslessness (chi-square) with a policy in the loop."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import MICRO, MICRO_LENGTH, MICRO_PROMPT, PROFILE, linear_profile, make, micro_target_and_law
from stats_helpers import assert_matches

from dspark.drafters import get_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Proposal
from dspark.engine import speculative_generate
from dspark.sampling import SamplingParams
from dspark.scheduler import (
    POLICY_NAMES,
    AsyncPrefixPolicy,
    GoodputPolicy,
    Scheduler,
    ThroughputProfile,
    expected_rate,
    greedy_path,
    make_policy,
    prefix_schedule,
    prefix_survival,
)


class Recording(Scheduler):
    """The core scheduler, remembering every verify length it chose."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.seen: set[int] = set()

    def __call__(self, proposal):
        ells = super().__call__(proposal)
        self.seen.update(ells.tolist())
        return ells


def brute_force_best(survivals: torch.Tensor, profile: ThroughputProfile) -> float:
    R, gamma = survivals.shape
    return max(
        expected_rate(survivals, torch.tensor(ells), profile)
        for ells in itertools.product(range(gamma + 1), repeat=R)
    )


def path_rates(survivals: torch.Tensor, profile: ThroughputProfile) -> list[float]:
    """Θ after admitting the first n candidates of the greedy path, n = 0..R·γ."""
    R = survivals.shape[0]
    gains = [float(survivals[r, j]) for r, j in greedy_path(survivals).tolist()]
    return [(R + sum(gains[:n])) * profile.sps(R + n) for n in range(len(gains) + 1)]


def is_unimodal(values: list[float]) -> bool:
    peak = max(range(len(values)), key=values.__getitem__)
    return all(a < b for a, b in zip(values[:peak], values[1 : peak + 1])) and all(
        a >= b for a, b in zip(values[peak:], values[peak + 1 :])
    )


def test_survival_is_the_cumulative_product_and_sts_keeps_order():
    conf = torch.tensor([[0.9, 0.5, 1.0], [0.2, 0.9, 0.9]])
    torch.testing.assert_close(
        prefix_survival(conf), torch.tensor([[0.9, 0.45, 0.45], [0.2, 0.18, 0.162]]).double()
    )
    hot = prefix_survival(conf, torch.tensor([2.0, 2.0, 2.0]))  # a temperature > 1 pulls confidences to ½
    assert hot[0, 0] < 0.9 and hot[1, 0] > 0.2
    assert torch.equal(
        conf.flatten().argsort(), prefix_survival(conf.view(-1, 1), torch.tensor([3.0])).flatten().argsort()
    )


def test_greedy_path_order_and_prefixes():
    a = torch.tensor([[0.9, 0.5, 0.5], [0.9, 0.8, 0.1]]).double()
    path = greedy_path(a).tolist()
    # ties: earlier position first, then lower request; equal survivals in a row keep their order
    assert path == [[0, 0], [1, 0], [1, 1], [0, 1], [0, 2], [1, 2]]


@pytest.mark.parametrize("seed", range(6))
def test_algorithm_1_equals_brute_force_when_theta_is_unimodal(seed):
    g = torch.Generator().manual_seed(seed)
    checked = 0
    for _ in range(40):
        R, gamma = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        conf = torch.rand(R, gamma, generator=g) ** 0.5
        survivals = prefix_survival(conf)
        fixed, per_token = [float(x) for x in torch.rand(2, generator=g) + 0.05]
        profile = linear_profile(fixed, per_token)
        if not is_unimodal(path_rates(survivals, profile)):
            continue
        lengths = prefix_schedule(survivals, profile)
        assert expected_rate(survivals, lengths, profile) == pytest.approx(
            brute_force_best(survivals, profile)
        )
        checked += 1
    assert checked >= 20  # the property was exercised, not skipped


def test_lengths_are_prefixes_of_the_greedy_path():
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        survivals = prefix_survival(torch.rand(5, 4, generator=g))
        for lengths in (prefix_schedule(survivals, linear_profile(0.3, 0.05)),
                        prefix_schedule(survivals, linear_profile(0.3, 0.05), early_stop=False),
                        prefix_schedule(survivals, linear_profile(0.3, 0.05), budget=7)):  # fmt: skip
            assert bool(((lengths >= 0) & (lengths <= 4)).all())
            n = int(lengths.sum())
            admitted = {(r, j) for r in range(5) for j in range(int(lengths[r]))}
            assert admitted == {tuple(x) for x in greedy_path(survivals)[:n].tolist()}


def test_edge_cases_no_requests_one_request_zero_confidence():
    profile = linear_profile(1.0, 0.01)
    assert prefix_schedule(torch.zeros(0, 4).double(), profile).shape == (0,)
    assert prefix_schedule(prefix_survival(torch.zeros(3, 4)), profile).tolist() == [0, 0, 0]
    assert prefix_schedule(prefix_survival(torch.ones(1, 4)), profile).tolist() == [4]  # cheap and sure
    assert prefix_schedule(
        prefix_survival(torch.full((1, 4), 0.9)), ThroughputProfile([1.0, 0.1])
    ).tolist() == [0]
    for name in POLICY_NAMES:
        assert make_policy(name).lengths(torch.zeros(0, 3).double(), profile).shape == (0,)


def test_early_stop_is_trapped_by_a_jagged_profile_and_async_is_not():
    # CUDA-graph-like staircase: the first extra token costs a whole new bucket
    jagged = ThroughputProfile([1.0] + [0.5] * 15)
    survivals = prefix_survival(torch.full((1, 4), 0.95))
    trapped = prefix_schedule(survivals, jagged)
    assert trapped.tolist() == [0]  # Θ_1 = 1.95 · 0.5 < Θ_0 = 1: the early stop halts
    best = brute_force_best(survivals, jagged)
    assert expected_rate(survivals, trapped, jagged) < best
    policy = AsyncPrefixPolicy()
    lengths = [policy.lengths(survivals, jagged) for _ in range(4)]
    assert lengths[0].tolist() == lengths[1].tolist() == [0]  # no history yet: Algorithm 1
    assert lengths[3].tolist() == [4] and expected_rate(survivals, lengths[3], jagged) == pytest.approx(best)


def test_async_budget_and_minimum_length():
    profile = linear_profile(1.0, 0.02)
    policy = AsyncPrefixPolicy(min_length=1)
    old = prefix_survival(torch.tensor([[0.9, 0.9, 0.9], [0.1, 0.1, 0.1]]))
    policy.lengths(old, profile)
    policy.lengths(old, profile)
    K = int(prefix_schedule(old, profile, early_stop=False).sum())
    now = prefix_survival(torch.tensor([[0.1, 0.1, 0.1], [0.9, 0.9, 0.9]]))
    lengths = policy.lengths(now, profile)
    assert int(lengths.sum()) == max(K, 2) and bool((lengths >= 1).all())
    assert lengths[1] >= lengths[0]  # the budget goes to the currently confident request


def test_baseline_policies():
    survivals = prefix_survival(torch.tensor([[0.9, 0.8, 0.5], [0.4, 0.9, 0.9]]))
    profile = linear_profile(1.0, 0.05)
    assert make_policy("none").lengths(survivals, profile).tolist() == [0, 0]
    assert make_policy("mtp1").lengths(survivals, profile).tolist() == [1, 1]
    assert make_policy("fixed").lengths(survivals, profile).tolist() == [3, 3]
    # survivals: (0.9, 0.72, 0.36) and (0.4, 0.36, 0.324)
    assert make_policy("threshold", threshold=0.5).lengths(survivals, profile).tolist() == [2, 0]
    goodput = GoodputPolicy(alpha=0.0)
    assert goodput.lengths(survivals, profile).tolist() == [0, 0]  # nothing is ever accepted
    for _ in range(50):
        goodput.observe(torch.tensor([3, 3]), torch.tensor([3, 3]))
    assert goodput.alpha > 0.99 and goodput.lengths(survivals, profile).tolist() == [3, 3]
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest")


@pytest.mark.parametrize("policy_name", ["dspark", "dspark-async", "threshold"])
def test_policy_driven_sampling_is_lossless(policy_name):
    """The Markov confidence head drives the verify lengths; the output must still
    follow the target's law exactly (vocab-5 model, exact enumeration, chi-square)."""
    target, joint = micro_target_and_law()
    params, prompt, length = SamplingParams(temperature=1.0), MICRO_PROMPT, MICRO_LENGTH
    drafter = make(target, "dspark", gamma=3, rank=4)
    with torch.no_grad():  # spread the confidences so that the chosen lengths vary
        torch.nn.init.normal_(drafter.head.confidence.weight, std=2.0)
    profile = linear_profile(1.0, 0.004, max_tokens=4096)
    counts = torch.zeros(MICRO.vocab_size**length)
    lengths_seen = set()
    g = torch.Generator().manual_seed(7)
    for _ in range(12):
        policy = make_policy(policy_name, threshold=0.3)
        scheduler = Recording.for_drafter(policy, drafter, profile)
        result = speculative_generate(target, drafter, [prompt] * 1000, length, params, 3, g, None, scheduler)
        lengths_seen.update(scheduler.seen)
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
    assert len(lengths_seen) >= 2  # the policy really varied the verify lengths
    assert_matches(counts, joint.flatten())


CONFIDENCE_POLICIES = [n for n in POLICY_NAMES if make_policy(n).needs_confidence]


@pytest.mark.parametrize("policy_name", CONFIDENCE_POLICIES)
@pytest.mark.parametrize("kind", ["dflash", "eagle", "none"])
def test_confidence_policies_refuse_drafters_without_a_head(tiny_model, policy_name, kind):
    drafter = (
        make(tiny_model, "dflash")
        if kind == "dflash"
        else get_drafter("none", tiny_model)
        if kind == "none"
        else AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 4, ffn_hidden=32))
    )
    with pytest.raises(ValueError, match="no trained confidence head"):
        Scheduler.for_drafter(make_policy(policy_name), drafter, PROFILE)


def test_policies_that_ignore_confidences_accept_any_drafter(tiny_model):
    for name in sorted(set(POLICY_NAMES) - set(CONFIDENCE_POLICIES)):
        scheduler = Scheduler.for_drafter(make_policy(name), make(tiny_model, "dflash"), PROFILE)
        lengths = scheduler(Proposal(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, 5)))
        assert lengths.shape == (3,) and bool(((lengths >= 0) & (lengths <= 4)).all())


def test_the_scheduler_uses_the_sts_pair_it_is_given():
    """Same proposal, different STS pairs passed in -> the lengths follow the policy (Algorithm 1, a
    threshold) on the survivals calibrated with exactly that pair."""
    conf = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.6, 0.5, 0.9, 0.9]])
    proposal = Proposal(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, 5), conf)
    temps = torch.tensor([3.0, 2.0, 1.0, 1.0])
    for sts in (
        None,
        torch.full((4,), 0.5),
        temps,
        torch.stack([temps, torch.tensor([0.5, -0.5, 0.0, 1.0])]),
    ):
        survivals = prefix_survival(conf, sts)
        got = Scheduler(make_policy("dspark"), PROFILE, sts)(proposal)
        assert torch.equal(got, prefix_schedule(survivals, PROFILE))
        got = Scheduler(make_policy("threshold", threshold=0.3), PROFILE, sts)(proposal)
        assert torch.equal(got, make_policy("threshold", threshold=0.3).lengths(survivals, PROFILE))
