"""The paired bootstrap of macro-τ ratios (dspark/study/tau_intervals.py), on hand-made per-prompt counts."""

from __future__ import annotations

import pytest

from dspark.serving.rounds import RoundStats
from dspark.study.tau_intervals import macro_tau_ratio, prompt_counts, ratio_rows


def row(drafter: str, domain: str, tokens: list[int], rounds: list[int], temperature: float = 1.0) -> dict:
    return {"drafter": drafter, "domain": domain, "temperature": temperature, "prompt_tokens": tokens,
            "prompt_rounds": rounds}  # fmt: skip


def test_prompt_counts_follow_the_emitted_tokens():
    stats = RoundStats(verify_lens=[[3, 3], [3]], accepted=[[2, 0], [3]], emitted=[[3, 1], [2]])
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
