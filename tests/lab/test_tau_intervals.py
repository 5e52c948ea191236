"""The paired bootstrap of macro-τ ratios (dspark/lab/study/tau_intervals.py), on hand-made per-prompt counts."""

from __future__ import annotations

import pytest

from dspark.lab.study.tau_intervals import macro_tau_ratio, prompt_counts, ratio_rows, rows_of_runs
from dspark.requests import RoundStats


def row(drafter: str, domain: str, tokens: list[int], rounds: list[int], temperature: float = 1.0) -> dict:
    return {"drafter": drafter, "domain": domain, "temperature": temperature, "prompt_tokens": tokens,
            "prompt_rounds": rounds}  # fmt: skip


def test_prompt_counts_follow_the_emitted_tokens():
    stats = RoundStats.from_lists(verify_lens=[[3, 3], [3]], accepted=[[2, 0], [3]], emitted=[[3, 1], [2]])
    assert prompt_counts(stats) == ([4, 2], [2, 1])  # the last round of request 2 was cut by a stop


def test_a_ratio_the_same_on_every_prompt_has_no_spread():
    b = {"code": row("b", "code", [10, 30, 7], [10, 10, 7]), "math": row("b", "math", [5, 50], [5, 20])}
    a = {d: row("a", d, [2 * t for t in r["prompt_tokens"]], r["prompt_rounds"]) for d, r in b.items()}
    ratio, low, high = macro_tau_ratio(a, b)
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)


def test_the_interval_is_paired_and_macro():
    # prompt difficulty varies a lot but A is exactly 10% better on each prompt: pairing removes the spread
    b = {"code": row("b", "code", [10, 40, 12, 90], [10, 10, 10, 10])}
    a = {"code": row("a", "code", [11, 44, 13.2, 99], [10, 10, 10, 10])}
    ratio, low, high = macro_tau_ratio(a, b, draws=500)
    assert ratio == pytest.approx(1.1) and high - low < 1e-9
    # unrelated noise: the point estimate is the pooled one, and the interval is wide and contains it
    a = {"code": row("a", "code", [40, 10, 90, 12], [10, 10, 10, 10])}
    ratio, low, high = macro_tau_ratio(a, b, draws=2000)
    assert ratio == pytest.approx(1.0) and low < 0.8 and high > 1.2
    # the macro average weighs domains equally, not by their rounds
    b2 = {"code": row("b", "code", [20], [10]), "math": row("b", "math", [400], [100])}  # τ 2 and 4
    a2 = {"code": row("a", "code", [40], [10]), "math": row("a", "math", [400], [100])}  # τ 4 and 4
    assert macro_tau_ratio(a2, b2)[0] == pytest.approx(8 / 6)


def test_mismatched_prompts_or_domains_are_refused():
    b = {"code": row("b", "code", [10, 30], [10, 10])}
    with pytest.raises(ValueError, match="same prompts"):
        macro_tau_ratio({"code": row("a", "code", [10], [10])}, b)
    with pytest.raises(ValueError, match="same, non-empty set of domains"):
        macro_tau_ratio({"math": row("a", "math", [10, 30], [10, 10])}, b)


def test_ratio_rows_pair_every_drafter_per_temperature_and_skip_plain_decoding():
    rows = [row(n, "code", [10, 20], [5, 5], t) for t in (0.0, 1.0) for n in ("x", "y", "z")]
    rows.append({"drafter": "none", "domain": "code", "temperature": 1.0})  # no counts: skipped
    pairs = [(r["temperature"], r["a"], r["b"]) for r in ratio_rows(rows, draws=50)]
    assert pairs == [(t, a, b) for t in (0.0, 1.0) for a, b in (("x", "y"), ("x", "z"), ("y", "z"))]


def offline_record(rows: list[dict], per_domain: int = 2) -> dict:
    return {"benchmark": "offline", "prompts": "shipped held-out", "prompts_measured": {"code": per_domain},
            "max_new_tokens": 96, "results": rows}  # fmt: skip


def test_runs_are_paired_over_prompts_and_a_repeated_label_gets_its_run_number():
    """`bench ratios`: a drafter of a later run against one of a committed run, and a drafter measured in both
    runs against itself (label@2)."""
    first = offline_record(
        [row("dspark5", "code", [30, 10], [10, 5]), row("dspark", "code", [20, 10], [10, 5])]
    )
    second = offline_record([row("dspark2", "code", [24, 12], [8, 6]), row("dspark", "code", [22, 9], [10, 5]),
                             row("none", "code", [5, 5], [5, 5])])  # fmt: skip
    rows = rows_of_runs([first, second])
    assert [r["drafter"] for r in rows] == [
        "dspark5",
        "dspark",
        "dspark2",
        "dspark@2",
    ]  # plain decoding dropped
    pairs = {(r["a"], r["b"]): r["ratio"] for r in ratio_rows(rows)}
    assert pairs["dspark2", "dspark@2"] == pytest.approx((36 / 14) / (31 / 15))
    assert pairs["dspark", "dspark@2"] == pytest.approx((30 / 15) / (31 / 15))
    assert first["results"][1]["drafter"] == "dspark"  # the records themselves are not renamed


def test_runs_on_other_prompts_or_without_counts_are_refused():
    a = offline_record([row("a", "code", [3, 3], [1, 1])])
    with pytest.raises(ValueError, match="other prompts"):
        rows_of_runs([a, offline_record([row("b", "code", [3, 3, 3], [1, 1, 1])], per_domain=3)])
    with pytest.raises(ValueError, match="not `bench offline`"):
        rows_of_runs([a, {"benchmark": "depth", "results": []}])
    old = offline_record([{"drafter": "b", "domain": "code", "temperature": 1.0, "tau": 2.0}])
    with pytest.raises(ValueError, match="per-prompt counts"):
        rows_of_runs([a, old])
    with pytest.raises(ValueError, match="no runs"):
        rows_of_runs([])
