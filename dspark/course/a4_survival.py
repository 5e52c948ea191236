"""Assignment 4's checks: survival estimation -- label, events, ECE, AUROC, STS (DESIGN §3, §4, §7).

Hand-worked values for the confidence label, the events/mask of recorded rounds, ECE
(including unequal bin sizes and the bin edges) and AUROC (including ties); calibrated
survivals (values and monotonicity); and STS on synthetic rounds built as in
tests/core/test_calibration.py: the same temperatures as `dspark.calibration.fit_sts`
on the same data, planted temperatures recovered, unverified positions skipped.

What this file does not do: run anything itself (dspark/course/framework.py does).
"""

from __future__ import annotations

import torch

from dspark import calibration
from dspark.course.framework import (
    Assignment,
    CheckFailed,
    CheckList,
    Solution,
    expect_close,
    expect_equal,
    expect_number,
    expect_tensor,
    function,
    show,
)
from dspark.scheduler import prefix_survival

checks = CheckList()


def synthetic_rounds(n: int, true_temps: list[float], seed: int = 0, verify_lens: torch.Tensor | None = None):
    """(confidences, events, mask) of n rounds whose true conditional acceptance at position k is
    σ(logit(c_k)/T_k) (as tests/helpers.py's `synthetic_rounds` builds them; events and mask as
    `RoundStats.calibration_arrays` defines them, computed here in one go)."""
    g = torch.Generator().manual_seed(seed)
    gamma = len(true_temps)
    conf = torch.sigmoid(torch.randn(n, gamma, generator=g) * 2 + 1.5).double()
    true = torch.sigmoid(torch.logit(conf) / torch.tensor(true_temps).double())
    success = torch.rand(n, gamma, generator=g).double() < true
    lens = torch.full((n,), gamma) if verify_lens is None else verify_lens
    accepted = torch.minimum(success.long().cumprod(1).sum(1), lens)
    k = torch.arange(1, gamma + 1)[None, :]
    return conf, (k <= accepted[:, None]).double(), k <= lens[:, None]


def student_sts(solution: Solution, conf, events, mask) -> torch.Tensor:
    gamma = conf.shape[1]
    temps = function(solution, "fit_sts")(conf.clone(), events.clone(), mask.clone())
    temps = expect_tensor(temps, "fit_sts(...)", (gamma,)).double()  # finite: expect_tensor says so
    if not bool((temps > 0).all()):
        raise CheckFailed(f"temperatures {show(temps)} must be positive")
    return temps


@checks.add(points=2)
def confidence_label_hand_worked(solution: Solution) -> None:
    label = function(solution, "confidence_label")
    q, p = torch.tensor([0.5, 0.5]), torch.tensor([0.7, 0.3])
    expect_number(
        label(q, p),
        0.8,
        "confidence_label(q = [.5, .5], p = [.7, .3])",
        "1 − ½(|.5 − .7| + |.5 − .3|) = Σ min(q, p) = 0.8 (paper Appendix A's a1)",
        atol=1e-6,
    )
    qs = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    ps = torch.tensor([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    got = expect_tensor(label(qs, ps), "confidence_label on a (3, V) batch", (3,))
    expect_close(
        got,
        torch.tensor([1.0, 0.0, 0.5]),
        "confidence_label(q, p) for q = p, disjoint, half overlap",
        atol=1e-6,
        hint="one label per row: reduce over the last (vocabulary) dimension",
    )


@checks.add(points=2)
def events_and_mask_hand_worked(solution: Solution) -> None:
    out = function(solution, "events_and_mask")(torch.tensor([3, 1, 0, 2]), torch.tensor([2, 1, 0, 2]), 3)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise CheckFailed("events_and_mask should return a tuple (events, mask)")
    events, mask = expect_tensor(out[0], "events", (4, 3)), expect_tensor(out[1], "mask", (4, 3))
    expect_equal(
        events.double().tolist(),
        [[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 0]],
        "events for (ℓ, a) = (3, 2), (1, 1), (0, 0), (2, 2)",
        "event k: drafts 1..k all accepted, a ≥ k",
    )
    expect_equal(
        mask.bool().tolist(),
        [[True] * 3, [True, False, False], [False] * 3, [True, True, False]],
        "mask for ℓ = 3, 1, 0, 2",
        "position k was verified iff k ≤ ℓ",
    )


@checks.add(points=2)
def ece_hand_worked(solution: Solution) -> None:
    ece = function(solution, "ece")
    pred, obs = (
        torch.tensor([0.1, 0.1, 0.9, 0.9], dtype=torch.float64),
        torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float64),
    )
    expect_number(
        ece(pred, obs, 10),
        0.5 * 0.4 + 0.5 * 0.1,
        "ece([.1, .1, .9, .9], [0, 1, 1, 1], bins=10)",
        "bin [.1, .2): |.1 − .5| with half the mass; bin [.9, 1): |.9 − 1| with half the mass",
    )
    expect_number(ece(obs, obs), 0.0, "ece(obs, obs)", "a perfect predictor has ECE 0")


@checks.add(points=2)
def ece_weights_bins_by_size(solution: Solution) -> None:
    pred = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.9], dtype=torch.float64)
    obs = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    expect_number(
        function(solution, "ece")(pred, obs, 10),
        0.8 * 0.65 + 0.2 * 0.1,
        "ece with bins of 4 and 1",
        "weight each bin's gap by its share of the predictions: 4/5·|.1 − .75| + 1/5·|.9 − 1|",
    )


@checks.add(points=1)
def ece_bin_edges(solution: Solution) -> None:
    ece = function(solution, "ece")
    pred, obs = (
        torch.tensor([1.0, 0.95, 0.0, 0.05], dtype=torch.float64),
        torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64),
    )
    # bins=10: {1.0, 0.95} share the last bin (mean .975 vs .5), {0, .05} the first (.025 vs 0)
    expect_number(
        ece(pred, obs, 10),
        0.5 * 0.475 + 0.5 * 0.025,
        "ece([1, .95, 0, .05], [1, 0, 0, 0], bins=10)",
        "a prediction of exactly 1.0 belongs to the LAST bin",
    )
    expect_number(
        ece(pred, obs, 1), abs(2.0 / 4 - 1.0 / 4), "the same with bins=1", "honour the `bins` argument"
    )


@checks.add(points=2)
def auroc_hand_worked(solution: Solution) -> None:
    auroc = function(solution, "auroc")
    label = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    for scores, expected in (
        ([0.1, 0.2, 0.3, 0.4], 1.0),
        ([0.4, 0.3, 0.2, 0.1], 0.0),
        ([0.1, 0.3, 0.2, 0.4], 0.75),
    ):
        expect_number(
            auroc(torch.tensor(scores), label),
            expected,
            f"auroc({scores}, labels [0, 0, 1, 1])",
            "the fraction of (positive, negative) pairs the score orders correctly",
        )
    got = auroc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0]))
    if got is not None:
        raise CheckFailed(f"auroc with no negatives should be None, got {got!r}")


@checks.add(points=1)
def auroc_ties_count_half(solution: Solution) -> None:
    auroc = function(solution, "auroc")
    label = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    expect_number(
        auroc(torch.tensor([0.5, 0.5, 0.5, 0.5]), label),
        0.5,
        "auroc with every score equal",
        "a tied (positive, negative) pair counts ½",
    )
    expect_number(
        auroc(torch.tensor([0.2, 0.5, 0.5, 0.9]), label),
        0.875,
        "auroc([.2, .5, .5, .9], [0, 0, 1, 1])",
        "3 pairs ordered right + 1 tie counted ½, out of 4",
    )


@checks.add(points=2)
def calibrated_survival_values_and_order(solution: Solution) -> None:
    survival = function(solution, "calibrated_survival")
    conf = torch.tensor([[0.9, 0.5, 0.8], [0.3, 0.9, 0.6]]).double()
    expect_close(
        expect_tensor(survival(conf, None), "calibrated_survival(c, None)", (2, 3)),
        prefix_survival(conf),
        "calibrated_survival(c, None)",
        atol=1e-9,
        hint="without temperatures: the cumulative product",
    )
    temps = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64)
    expect_close(
        expect_tensor(survival(conf, temps), "calibrated_survival(c, T)", (2, 3)),
        prefix_survival(conf, temps),
        "calibrated_survival(c, T = [2, .5, 1])",
        atol=1e-9,
        hint="c̃_k = σ(logit(c_k) / T_k) for each confidence, THEN the product",
    )
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(50, 4, generator=g).double()
    got = expect_tensor(
        survival(conf, torch.tensor([0.3, 1.0, 2.0, 5.0], dtype=torch.float64)),
        "calibrated survivals",
        (50, 4),
    )
    if bool((got[:, 1:] > got[:, :-1] + 1e-12).any()):
        raise CheckFailed("calibrated survivals must be non-increasing along the positions k")
    one = survival(conf[:, :1], torch.tensor([3.0], dtype=torch.float64))
    if not torch.equal(
        conf[:, 0].argsort(), expect_tensor(one, "calibrated_survival(c[:, :1], T)", (50, 1))[:, 0].argsort()
    ):
        raise CheckFailed("a temperature must not change the ranking of the confidences at one position")


@checks.add(points=3)
def sts_matches_the_reference_search(solution: Solution) -> None:
    conf, events, mask = synthetic_rounds(4000, [2.0, 0.7, 1.5])
    got, want = student_sts(solution, conf, events, mask), calibration.fit_sts(conf, events, mask)
    if bool(((got / want).log().abs() > 0.03).any()):  # more than one step of the grid apart
        raise CheckFailed(
            f"temperatures {show(got)}, the reference search finds {show(want)}: fit left to right, "
            "T_k minimising the ECE of Π_{i≤k} c̃_i with the T_i (i < k) already fitted"
        )


@checks.add(points=3)
def sts_recovers_planted_temperatures(solution: Solution) -> None:
    planted = [2.0, 1.5, 3.0, 1.0]
    temps = student_sts(solution, *synthetic_rounds(20_000, planted))
    for k, (t, t_true) in enumerate(zip(temps.tolist(), planted)):
        if abs(t / t_true - 1) > 0.25:
            raise CheckFailed(f"T_{k + 1} = {t:.3f}, planted {t_true}: fitted temperatures {show(temps)}")
    conf, events, mask = synthetic_rounds(20_000, planted, seed=1)
    calibrated = prefix_survival(conf, temps)
    for k in range(len(planted)):
        after = calibration.ece(calibrated[:, k], events[:, k])
        if after > 0.02:
            raise CheckFailed(f"held-out ECE at position {k + 1} is {after:.3f} after STS (expected < 0.02)")


@checks.add(points=1)
def sts_skips_unverified_positions(solution: Solution) -> None:
    lens = torch.randint(1, 3, (6000,), generator=torch.Generator().manual_seed(3))  # ℓ ∈ {1, 2}, γ = 4
    conf, events, mask = synthetic_rounds(6000, [1.5, 2.0, 1.0, 1.0], seed=2, verify_lens=lens)
    got, want = student_sts(solution, conf, events, mask), calibration.fit_sts(conf, events, mask)
    if bool(((got / want).log().abs() > 0.03).any()):
        raise CheckFailed(
            f"temperatures {show(got)} with positions 3-4 never verified, the reference finds "
            f"{show(want)}: fit position k on the rounds whose mask verified it; none verified: T_k = 1"
        )


ASSIGNMENT = Assignment(
    number=4,
    title="Survival estimation and STS",
    folder="a4_survival",
    checks=tuple(checks.checks),
    reference="dspark.course.reference.a4_survival",
)
