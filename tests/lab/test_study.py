"""The offline-study helpers: threshold replay (hand-worked), fixed verify lengths, the round-latency probe,
tables, intervals, serve sweeps, figures, and Appendix A's counterexample."""

from __future__ import annotations

import pytest
import torch
from helpers import GREEDY, SHORT, make, prompts
from stats_helpers import assert_matches

from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.lab.study import plots
from dspark.lab.study.counterexample import counterexample
from dspark.lab.study.offline import measure_tau, round_latency, threshold_sweep
from dspark.lab.study.tables import markdown_table
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams

# two fully verified rounds, γ = 3: survivals (0.9, 0.45, 0.405) accepting 2, and (0.4, 0.36, 0.324) accepting 0
HAND = RoundStats.from_lists(
    verify_lens=[[3], [3]], accepted=[[2], [0]], confidences=[[[0.9, 0.5, 0.9]], [[0.4, 0.9, 0.9]]]
)


def test_threshold_sweep_hand_worked():
    zero, mid, high = threshold_sweep(HAND, [0.0, 0.42, 0.95])
    # θ = 0 verifies everything: accepted 2 + 0, rejected 1 + 3
    assert (zero["accepted_per_step"], zero["rejected_per_step"]) == (1.0, 2.0)
    assert zero["acceptance_rate"] == pytest.approx(1 / 3)
    # θ = 0.42: round 1 stops before 0.405 (ℓ = 2, both accepted), round 2 verifies nothing
    assert (mid["accepted_per_step"], mid["rejected_per_step"], mid["acceptance_rate"]) == (1.0, 0.0, 1.0)
    assert (high["accepted_per_step"], high["rejected_per_step"], high["acceptance_rate"]) == (0.0, 0.0, None)


def test_threshold_sweep_needs_full_rounds_with_confidences():
    with pytest.raises(ValueError, match="fully verified"):
        threshold_sweep(RoundStats.from_lists([[2]], [[1]], [[[0.5, 0.5, 0.5]]]), [0.1])
    with pytest.raises(ValueError, match="confidence head"):
        threshold_sweep(RoundStats.from_lists([[3]], [[1]], [[]]), [0.1])


@pytest.mark.parametrize("verify_len", [0, 1, 3, 4])
def test_measure_tau_with_fixed_verify_lengths(tiny_model, verify_len):
    drafter = make(tiny_model, "dspark", gamma=4)
    ps = prompts(SHORT, seed=3)
    rounds = measure_tau(tiny_model, drafter, ps, GREEDY, 4, 10, None, verify_len=verify_len, batch_size=2)
    assert len(rounds.accepted) == len(ps)
    assert all(ell == verify_len for L in rounds.verify_lens for ell in L)
    assert all(0 <= a <= verify_len for A in rounds.accepted for a in A)
    if verify_len == 0:
        assert rounds.tau == 1.0
    with pytest.raises(ValueError, match="verify_len"):
        measure_tau(tiny_model, drafter, ps, GREEDY, 4, 10, None, verify_len=5)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_round_latency_leaves_the_caches_as_they_were(tiny_model, kind):
    drafter = make(tiny_model, kind, gamma=4)
    row = round_latency(tiny_model, drafter, prompts(SHORT, seed=4), 3, SamplingParams(1.0), repeats=2)
    assert row["gamma"] == 3 and row["batch"] == len(SHORT)
    assert row["draft_ms"] > 0 and row["verify_ms"] > 0
    assert row["round_ms"] == pytest.approx(row["draft_ms"] + row["verify_ms"])
    # the drafter's context cache holds exactly the prompts (later rounds committed nothing)
    assert sorted(drafter.cache.lengths[: len(SHORT)].tolist()) == sorted(SHORT)
    with pytest.raises(ValueError, match="parallel"):
        eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=32))
        round_latency(tiny_model, eagle, prompts(SHORT), 3, SamplingParams(1.0))


def test_markdown_table():
    assert (
        markdown_table(["a", "b"], [["x", 1.234], [2, None]])
        == "| a | b |\n|---|---|\n| x | 1.23 |\n| 2 | - |\n"
    )


def test_wilson_interval_hand_worked():
    from dspark.lab.study.stats import wilson_interval

    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    narrow, wide = wilson_interval(500, 1000), wilson_interval(5, 10)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 5


def test_repeated_serve_sweeps_are_paired_within_a_repeat():
    """`combine_repeats`: medians per (policy, C), and ratios to plain decoding / MTP-1 taken within the same
    repeat, so a machine twice as fast in one repeat moves nothing; the 95% interval holds the mean."""
    from dspark.lab.study.pareto import combine_repeats, frontier_report
    from dspark.lab.study.stats import mean_interval

    points = []
    for repeat, speed in enumerate([1.0, 2.0, 1.1]):  # the machine's speed drifts between repeats
        for policy, own in (("none", 100.0), ("mtp1", 90.0), ("dspark", 105.0 + repeat)):
            points.append({"policy": policy, "drafter": "x", "concurrency": 4, "repeat": repeat,
                           "throughput": own * speed, "tps_per_user": own * speed / 4, "tpot_ms": 1.0,
                           "mean_verify_len": 1.0, "tau": 1.5, "completed": 3})  # fmt: skip
    combined = {p["policy"]: p for p in combine_repeats(points)}
    assert (
        combined["none"]["throughput"] == pytest.approx(110.0) and combined["none"]["repeats"] == 3
    )  # median
    assert "vs_plain" not in combined["none"] and "per_user_vs_mtp1" not in combined["mtp1"]
    ratios = combined["dspark"]["vs_plain"]["ratios"]
    assert ratios == pytest.approx([1.05, 1.06, 1.07])  # paired: the drift cancels
    r = combined["dspark"]["vs_plain"]
    assert r["mean"] == pytest.approx(1.06) and r["low"] < r["mean"] < r["high"] < 1.1
    assert combined["mtp1"]["vs_plain"]["mean"] == pytest.approx(0.9) == combined["mtp1"]["vs_plain"]["low"]
    assert combined["dspark"]["per_user_vs_mtp1"]["mean"] == pytest.approx(1.06 / 0.9)
    assert "+6.0% (" in frontier_report(list(combined.values()), ["none", "mtp1", "dspark"])
    assert mean_interval([2.0]) == (2.0, 2.0, 2.0)
    mean, low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and high - mean == pytest.approx(3.182 * (5 / 3) ** 0.5 / 2)


def test_study_figures_draw_a_single_domain(tmp_path):
    """A prompts file may hold one domain (HumanEval: code): every per-domain figure then has one panel."""
    depth = [{"kind": "dspark", "layers": n, "domain": "code", "tau": 2.0 + n / 10} for n in (1, 2)]
    budget = [{**r, "epochs": e} for r in depth for e in (0.5, 1.0)]
    acceptance = [{"drafter": "d", "domain": "code", "cond_acceptance": [0.6, 0.5], "cond_tries": [10, 6]}]
    plots.plot_depth(depth, tmp_path / "depth.png")
    plots.plot_budget(budget, tmp_path / "budget.png")
    plots.plot_position_acceptance(acceptance, tmp_path / "acceptance.png", "one domain")
    assert all((tmp_path / f"{n}.png").stat().st_size > 0 for n in ("depth", "budget", "acceptance"))


def test_appendix_a_counterexample():
    result = counterexample(20_000, seed=0)
    n = result["draws"]
    for name, law in (("retrospective", [0.85, 0.15]), ("early_stop", [0.7, 0.3]), ("async", [0.7, 0.3])):
        assert_matches(torch.tensor(result[name]) * n, torch.tensor(law))
    with pytest.raises(AssertionError):  # and the retrospective scheduler is measurably NOT the target
        assert_matches(torch.tensor(result["retrospective"]) * n, torch.tensor([0.7, 0.3]))
    assert result["early_stop_mean_verify_len"] == 0
