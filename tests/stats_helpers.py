"""Chi-square assertion for the losslessness tests; the statistics live in dspark/lab/study/stats.py."""

from __future__ import annotations

import torch

from dspark.lab.study.stats import chi_square, chi_square_critical


def assert_matches(counts: torch.Tensor, probs: torch.Tensor, z: float = 4.0) -> None:
    stat, df = chi_square(counts, probs)
    limit = chi_square_critical(df, z)
    assert stat < limit, f"chi-square {stat:.1f} >= {limit:.1f} (df {df}): samples do not follow the target"
