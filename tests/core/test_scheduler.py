"""The prefix scheduler (Algorithm 1), its asynchronous variant, the baselines,
Appendix A's counterexample and end-to-end losslessness with a policy in the loop."""

from __future__ import annotations

import itertools

import pytest
import torch
from stats_helpers import assert_matches
from test_parallel_drafter import make
from test_speculative import MICRO, MICRO_LENGTH, MICRO_PROMPT, micro_target_and_law

from dspark.engine import speculative_generate
from dspark.lab.cost_aware.scheduler import forecast_lengths, with_drafting
from dspark.lab.study.counterexample import counterexample
from dspark.profiler import interpolated_times, isotonic_fit, profile_from_points
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


def linear_profile(fixed: float, per_token: float, max_tokens: int = 64) -> ThroughputProfile:
    return ThroughputProfile([1 / (fixed + per_token * B) for B in range(1, max_tokens + 1)])


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


def test_isotonic_fit_pools_a_noisy_point_with_its_neighbours():
    assert isotonic_fit([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]  # already non-decreasing: unchanged
    # one slow measurement at the second point: pooled with the two lower points after it, not carried to them
    fitted = isotonic_fit([123.0, 177.0, 150.0, 150.0, 183.0])
    assert fitted == pytest.approx([123.0, 159.0, 159.0, 159.0, 183.0])
    assert isotonic_fit([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    times = interpolated_times([1, 2, 4, 8, 12], [123.0, 177.0, 150.0, 150.0, 183.0], 12)
    # (the max-clamp carried 177 up to B = 8)
    assert times[1] == pytest.approx(159.0) and max(times[:8]) == pytest.approx(159.0)
    assert all(a <= b for a, b in zip(times, times[1:]))


def is_unimodal(values: list[float]) -> bool:
    peak = max(range(len(values)), key=values.__getitem__)
    return all(a < b for a, b in zip(values[:peak], values[1 : peak + 1])) and all(
        a >= b for a, b in zip(values[peak:], values[peak + 1 :])
    )


def test_profile_from_points_interpolates_and_never_speeds_up():
    profile = profile_from_points([1, 4, 8], [1.0, 2.5, 2.0], max_tokens=10)  # a noisy dip at 8
    assert profile.sps(1) == 1.0 and profile.sps(4) == pytest.approx(1 / 2.25)  # 4 and 8 pooled: 2.25
    assert profile.sps(8) == pytest.approx(1 / 2.25)
    assert profile.sps(2) == pytest.approx(1 / (1.0 + 1.25 / 3))  # linear between the points
    assert all(a >= b for a, b in zip(profile.steps_per_second, profile.steps_per_second[1:]))
    assert profile.sps(20) == pytest.approx(profile.sps(10) / 2)  # beyond the table: proportional
    with pytest.raises(ValueError):
        ThroughputProfile([1.0, 0.0])
    with pytest.raises(ValueError):
        profile.sps(0)


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


def test_a_step_that_drafts_is_algorithm_1_on_the_profile_with_drafting():
    """The cost-aware scheduler prices drafting by handing the core's walk `with_drafting(profile, d)`:
    it admits exactly the greedy path's prefix that a walk on Θ = τ / (1/SPS(B) + d) computed here admits
    (ties in survival broken by position then request, early stop or global argmax, smooth and jagged
    profiles); d = 0 is the profile itself, the paper's Θ to the bit. The lab's host-side `forecast_lengths`
    (lists, for the speculate-or-not forecast) admits exactly what `prefix_schedule` does, ties included."""
    g = torch.Generator().manual_seed(3)
    profiles = [
        linear_profile(0.3, 0.05),
        linear_profile(1.0, 0.002),
        ThroughputProfile([1.0] + [0.6] * 7 + [0.3] * 56),
    ]
    drafting_changed = checked = 0
    for trial in range(300):
        R, gamma = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 8, (1,), generator=g))
        conf = torch.rand(R, gamma, generator=g)
        if trial % 3 == 0:  # many exact ties
            conf = (conf * 4).round() / 4
        if trial % 5 == 0:
            conf[0] = conf[-1]  # two identical requests
        survivals = prefix_survival(conf)
        gains = [float(survivals[r, j]) for r, j in greedy_path(survivals).tolist()]
        for profile, early_stop, d in itertools.product(profiles, (True, False), (0.0, 0.02)):
            rates = [(R + sum(gains[:n])) / (1 / profile.sps(R + n) + d) for n in range(len(gains) + 1)]
            best, n_admit, near_tie = rates[0], 0, False
            for n in range(1, len(rates)):
                near_tie |= abs(rates[n] - best) <= 1e-9 * best  # rounding may decide: no claim
                if rates[n] > best:
                    best, n_admit = rates[n], n
                elif early_stop:
                    break
            got = prefix_schedule(survivals, with_drafting(profile, d), early_stop)
            # the lab's host-side forecast sorts the same path on lists and walks it with the same function
            assert forecast_lengths(survivals.tolist(), with_drafting(profile, d), early_stop) == got.tolist()
            if not near_tie:
                assert int(got.sum()) == n_admit, (conf, profile.steps_per_second[:3], early_stop, d)
                checked += 1
            free = prefix_schedule(survivals, profile, early_stop)
            drafting_changed += d > 0 and not torch.equal(got, free)
            if d == 0:
                assert with_drafting(profile, d) is profile
    assert drafting_changed > 0 and checked > 3000  # the drafting time changes some decisions; few near-ties


def test_edge_cases_no_requests_one_request_zero_confidence():
    profile = linear_profile(1.0, 0.01)
    assert prefix_schedule(torch.zeros(0, 4).double(), profile).shape == (0,)
    assert prefix_schedule(prefix_survival(torch.zeros(3, 4)), profile).tolist() == [0, 0, 0]
    assert prefix_schedule(prefix_survival(torch.ones(1, 4)), profile).tolist() == [4]  # cheap and sure
    assert prefix_schedule(
        prefix_survival(torch.full((1, 4), 0.9)), ThroughputProfile([1.0, 0.1])
    ).tolist() == [0]
    for name in POLICY_NAMES:
        assert make_policy(name).lengths(torch.zeros(0, 3).double(), 3, profile).shape == (0,)


def test_early_stop_is_trapped_by_a_jagged_profile_and_async_is_not():
    # CUDA-graph-like staircase: the first extra token costs a whole new bucket
    jagged = ThroughputProfile([1.0] + [0.5] * 15)
    survivals = prefix_survival(torch.full((1, 4), 0.95))
    trapped = prefix_schedule(survivals, jagged)
    assert trapped.tolist() == [0]  # Θ_1 = 1.95 · 0.5 < Θ_0 = 1: the early stop halts
    best = brute_force_best(survivals, jagged)
    assert expected_rate(survivals, trapped, jagged) < best
    policy = AsyncPrefixPolicy()
    lengths = [policy.lengths(survivals, 4, jagged) for _ in range(4)]
    assert lengths[0].tolist() == lengths[1].tolist() == [0]  # no history yet: Algorithm 1
    assert lengths[3].tolist() == [4] and expected_rate(survivals, lengths[3], jagged) == pytest.approx(best)


def test_async_budget_and_minimum_length():
    profile = linear_profile(1.0, 0.02)
    policy = AsyncPrefixPolicy(min_length=1)
    old = prefix_survival(torch.tensor([[0.9, 0.9, 0.9], [0.1, 0.1, 0.1]]))
    policy.lengths(old, 3, profile)
    policy.lengths(old, 3, profile)
    K = int(prefix_schedule(old, profile, early_stop=False).sum())
    now = prefix_survival(torch.tensor([[0.1, 0.1, 0.1], [0.9, 0.9, 0.9]]))
    lengths = policy.lengths(now, 3, profile)
    assert int(lengths.sum()) == max(K, 2) and bool((lengths >= 1).all())
    assert lengths[1] >= lengths[0]  # the budget goes to the currently confident request


def test_baseline_policies():
    survivals = prefix_survival(torch.tensor([[0.9, 0.8, 0.5], [0.4, 0.9, 0.9]]))
    profile = linear_profile(1.0, 0.05)
    assert make_policy("none").lengths(survivals, 3, profile).tolist() == [0, 0]
    assert make_policy("mtp1").lengths(survivals, 3, profile).tolist() == [1, 1]
    assert make_policy("fixed").lengths(survivals, 3, profile).tolist() == [3, 3]
    # survivals: (0.9, 0.72, 0.36) and (0.4, 0.36, 0.324)
    assert make_policy("threshold", threshold=0.5).lengths(survivals, 3, profile).tolist() == [2, 0]
    goodput = GoodputPolicy(alpha=0.0)
    assert goodput.lengths(survivals, 3, profile).tolist() == [0, 0]  # nothing is ever accepted
    for _ in range(50):
        goodput.observe(torch.tensor([3, 3]), torch.tensor([3, 3]))
    assert goodput.alpha > 0.99 and goodput.lengths(survivals, 3, profile).tolist() == [3, 3]
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest")


def test_appendix_a_counterexample():
    result = counterexample(20_000, seed=0)
    n = result["draws"]
    for name, law in (("retrospective", [0.85, 0.15]), ("early_stop", [0.7, 0.3]), ("async", [0.7, 0.3])):
        assert_matches(torch.tensor(result[name]) * n, torch.tensor(law))
    with pytest.raises(AssertionError):  # and the retrospective scheduler is measurably NOT the target
        assert_matches(torch.tensor(result["retrospective"]) * n, torch.tensor([0.7, 0.3]))
    assert result["early_stop_mean_verify_len"] == 0


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
