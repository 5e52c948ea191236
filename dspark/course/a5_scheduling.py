"""Assignment 5's checks: the prefix scheduler (Algorithm 1) and the Appendix A counterexample (DESIGN §5).

Survivals and the greedy path's order (hand-worked, ties), Θ along the path on
Appendix A's numbers, edge cases (R = 0, R = 1, zero confidences), prefixes, equality
with a brute-force optimum wherever Θ is unimodal along the path (as in
tests/core/test_scheduler.py), the early stop against the retrospective argmax, and last
Appendix A itself, run through the project's `verify` with the STUDENT's scheduler:
the retrospective variant must show the bias (0.85, 0.15), Algorithm 1 must not.

What this file does not do: run anything itself (dspark/course/framework.py does).
"""

from __future__ import annotations

import itertools

import torch

from dspark.course.framework import (
    Assignment,
    CheckFailed,
    CheckList,
    Solution,
    expect_close,
    expect_equal,
    expect_tensor,
    function,
    show,
)
from dspark.lab.study import counterexample as appendix_a
from dspark.lab.study.stats import chi_square, chi_square_critical
from dspark.sampling import sample_from_probs
from dspark.scheduler import ThroughputProfile, expected_rate, greedy_path, prefix_survival
from dspark.verify import verify

checks = CheckList()


def linear_profile(fixed: float, per_token: float, max_tokens: int = 64) -> ThroughputProfile:
    return ThroughputProfile([1 / (fixed + per_token * B) for B in range(1, max_tokens + 1)])


def schedule(
    solution: Solution, survivals: torch.Tensor, profile: ThroughputProfile, early_stop: bool = True
):
    """The student's verify lengths, checked for shape and range."""
    R, gamma = survivals.shape
    lengths = function(solution, "prefix_schedule")(survivals.clone(), profile, early_stop)
    lengths = expect_tensor(lengths, "prefix_schedule(...)", (R,)).long()
    if bool(((lengths < 0) | (lengths > gamma)).any()):
        raise CheckFailed(f"verify lengths {show(lengths)} are outside 0..γ = 0..{gamma}")
    return lengths


def reference_rates(survivals: torch.Tensor, profile: ThroughputProfile) -> list[float]:
    R = survivals.shape[0]
    gains = [float(survivals[r, j]) for r, j in greedy_path(survivals).tolist()]
    return [(R + sum(gains[:n])) * profile.sps(R + n) for n in range(len(gains) + 1)]


def is_unimodal(values: list[float]) -> bool:
    peak = max(range(len(values)), key=values.__getitem__)
    rising = all(a < b for a, b in zip(values[:peak], values[1 : peak + 1]))
    return rising and all(a >= b for a, b in zip(values[peak:], values[peak + 1 :]))


@checks.add(points=1)
def survival_is_the_cumulative_product(solution: Solution) -> None:
    conf = torch.tensor([[0.9, 0.5, 1.0], [0.2, 0.9, 0.9]])
    got = expect_tensor(function(solution, "prefix_survival")(conf), "prefix_survival(c)", (2, 3))
    expect_close(
        got,
        torch.tensor([[0.9, 0.45, 0.45], [0.2, 0.18, 0.162]]),
        "prefix_survival(c)",
        hint="a[r, j] = c[r, 0]·…·c[r, j]",
    )


@checks.add(points=2)
def greedy_path_order(solution: Solution) -> None:
    a = torch.tensor([[0.9, 0.5, 0.5], [0.9, 0.8, 0.1]], dtype=torch.float64)
    got = expect_tensor(function(solution, "greedy_path")(a), "greedy_path(a)", (6, 2))
    expect_equal(
        got.tolist(),
        [[0, 0], [1, 0], [1, 1], [0, 1], [0, 2], [1, 2]],
        f"greedy_path({show(a)})",
        "descending survival; ties: earlier position, then lower request",
    )


@checks.add(points=2)
def greedy_path_ties_go_to_the_earlier_position(solution: Solution) -> None:
    a = torch.tensor([[1.0, 0.6], [0.6, 0.18]], dtype=torch.float64)  # (0, 1) and (1, 0) tie at 0.6
    got = expect_tensor(function(solution, "greedy_path")(a), "greedy_path(a)", (4, 2))
    expect_equal(
        got.tolist(),
        [[0, 0], [1, 0], [0, 1], [1, 1]],
        f"greedy_path({show(a)})",
        "(r=1, j=0) and (r=0, j=1) tie: the earlier POSITION goes first, whatever the request",
    )


@checks.add(points=2)
def theta_along_the_path_appendix_a(solution: Solution) -> None:
    rates = function(solution, "path_rates")
    for second, expected in ((0.9, [1.0, 0.9, 1.134]), (0.0, [1.0, 0.9, 0.81])):
        a = torch.tensor([[0.8, 0.8 * second]], dtype=torch.float64)
        got = [float(x) for x in rates(a, appendix_a.PROFILE)]
        expect_close(
            torch.tensor(got),
            torch.tensor(expected),
            f"path_rates(a = {show(a)}, SPS = 1, .5, .45)",
            atol=1e-6,
            hint="Θ_n = (R + Σ admitted a) · SPS(R + n): every request yields its bonus token",
        )


@checks.add(points=2)
def edge_cases_no_request_one_request_zero_confidence(solution: Solution) -> None:
    profile = linear_profile(1.0, 0.01)
    expect_equal(
        schedule(solution, torch.zeros(0, 4).double(), profile).tolist(), [], "lengths for R = 0 requests"
    )
    expect_equal(
        schedule(solution, prefix_survival(torch.zeros(3, 4)), profile).tolist(),
        [0, 0, 0],
        "lengths with zero confidences",
        "admitting a = 0 only slows the pass",
    )
    expect_equal(
        schedule(solution, prefix_survival(torch.ones(1, 4)), profile).tolist(),
        [4],
        "lengths for one request, certain drafts, cheap tokens",
    )
    expect_equal(
        schedule(solution, prefix_survival(torch.full((1, 4), 0.9)), ThroughputProfile([1.0, 0.1])).tolist(),
        [0],
        "lengths when a second token makes the pass 10x slower",
    )


@checks.add(points=1)
def strict_improvement_only(solution: Solution) -> None:
    a, profile = torch.tensor([[1.0]]).double(), ThroughputProfile([1.0, 0.5])  # Θ_0 = 1·1 = Θ_1 = 2·0.5
    expect_equal(
        schedule(solution, a, profile).tolist(),
        [0],
        "Algorithm 1 when admitting leaves Θ unchanged",
        "admit only while Θ strictly improves",
    )
    expect_equal(
        schedule(solution, a, profile, early_stop=False).tolist(),
        [0],
        "the retrospective argmax when Θ ties",
        "take the first n with the largest Θ",
    )


@checks.add(points=2)
def lengths_are_prefixes_of_the_path(solution: Solution) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(15):
        survivals = prefix_survival(torch.rand(5, 4, generator=g))
        for early_stop in (True, False):
            lengths = schedule(solution, survivals, linear_profile(0.3, 0.05), early_stop)
            n = int(lengths.sum())
            admitted = {(r, j) for r in range(5) for j in range(int(lengths[r]))}
            if admitted != {tuple(x) for x in greedy_path(survivals)[:n].tolist()}:
                raise CheckFailed(
                    f"lengths {lengths.tolist()} (early_stop={early_stop}) are not the first {n} "
                    "candidates of the greedy path: admit along the path, one candidate at a time"
                )


@checks.add(points=3)
def optimal_when_theta_is_unimodal(solution: Solution) -> None:
    g = torch.Generator().manual_seed(0)
    checked = 0
    while checked < 25:
        R, gamma = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        survivals = prefix_survival(torch.rand(R, gamma, generator=g) ** 0.5)
        profile = linear_profile(*[float(x) for x in torch.rand(2, generator=g) + 0.05])
        if not is_unimodal(reference_rates(survivals, profile)):
            continue
        lengths = schedule(solution, survivals, profile)
        best = max(
            expected_rate(survivals, torch.tensor(ells), profile)
            for ells in itertools.product(range(gamma + 1), repeat=R)
        )
        got = expected_rate(survivals, lengths, profile)
        if got < best - 1e-9:
            raise CheckFailed(
                f"for survivals {show(survivals)} your lengths {lengths.tolist()} reach Θ = {got:.4f}, "
                f"the best is {best:.4f} (Θ is unimodal along the path, so the early stop finds it)"
            )
        checked += 1


@checks.add(points=2)
def early_stop_halts_at_the_first_drop(solution: Solution) -> None:
    jagged = ThroughputProfile([1.0] + [0.5] * 15)  # the first extra token costs a whole new bucket
    survivals = prefix_survival(torch.full((1, 4), 0.95))
    expect_equal(
        schedule(solution, survivals, jagged).tolist(),
        [0],
        "Algorithm 1 on a jagged SPS profile",
        "Θ_1 = 1.95·0.5 < Θ_0 = 1: stop at the first candidate that does not improve Θ",
    )
    expect_equal(
        schedule(solution, survivals, jagged, early_stop=False).tolist(),
        [4],
        "the retrospective variant on the same profile",
        "it takes the global argmax, Θ_4 = 4.07·0.5",
    )


def appendix_a_first_tokens(
    solution: Solution, early_stop: bool, draws: int = 20_000
) -> tuple[torch.Tensor, float]:
    """Appendix A (dspark/lab/study/counterexample.py) with the student's scheduler deciding ℓ."""
    g = torch.Generator().manual_seed(0)
    p_t, p_d = torch.tensor(appendix_a.TARGET), torch.tensor(appendix_a.DRAFT)
    drafts = sample_from_probs(p_d.expand(draws, 2, 2), torch.rand(draws, 2, generator=g))
    lengths = {}  # the scheduler sees one of two survival rows, depending on the first draft
    for x1, c2 in appendix_a.SECOND_CONFIDENCE.items():
        a1 = appendix_a.FIRST_CONFIDENCE
        lengths[x1] = int(
            schedule(solution, torch.tensor([[a1, a1 * c2]]).double(), appendix_a.PROFILE, early_stop)
        )
    ells = torch.tensor([lengths[int(x)] for x in drafts[:, 0]])
    u_acc, u_res = torch.rand(draws, 2, generator=g), torch.rand(draws, generator=g)
    result = verify(drafts, p_d.expand(draws, 2, 2), p_t.expand(draws, 3, 2), ells, u_acc, u_res)
    first = torch.where(result.accepted > 0, drafts[:, 0], result.next_token)
    return torch.bincount(first, minlength=2).double(), float(ells.double().mean())


def follows(counts: torch.Tensor, law: list[float]) -> bool:
    stat, df = chi_square(counts, torch.tensor(law))
    return stat < chi_square_critical(df)


@checks.add(points=2)
def appendix_a_retrospective_is_biased(solution: Solution) -> None:
    counts, _ = appendix_a_first_tokens(solution, early_stop=False)
    freq = [round(float(c) / float(counts.sum()), 3) for c in counts]
    if not follows(counts, [0.85, 0.15]) or follows(counts, list(appendix_a.TARGET)):
        raise CheckFailed(
            f"with early_stop=False the first token came out {freq}, expected about [0.85, 0.15]: "
            "the retrospective argmax verifies x1 only when x1 = A (Θ_2 = 1.134 > 1)"
        )


@checks.add(points=2)
def appendix_a_algorithm_1_is_lossless(solution: Solution) -> None:
    counts, mean_len = appendix_a_first_tokens(solution, early_stop=True)
    freq = [round(float(c) / float(counts.sum()), 3) for c in counts]
    if mean_len != 0 or not follows(counts, list(appendix_a.TARGET)):
        raise CheckFailed(
            f"with the early stop the first token came out {freq} with mean ℓ = {mean_len:.3f}, "
            "expected the target's [0.7, 0.3] and ℓ = 0 (Θ_1 = 0.9 < Θ_0 = 1.0: stop)"
        )


ASSIGNMENT = Assignment(
    number=5,
    title="Hardware-aware scheduling",
    folder="a5_scheduler",
    checks=tuple(checks.checks),
    reference="dspark.course.reference.a5_scheduling",
)
