"""Small statistics without SciPy: chi-square goodness of fit, and binomial intervals.

The losslessness checks (tests/, walkthrough 08) count the tokens a sampler
draws and compare them with the target's probabilities: `chi_square` gives
Pearson's statistic and its degrees of freedom, `chi_square_critical` the
threshold it must stay below. `wilson_interval` is the 95% interval the study's
acceptance-by-position figures draw around each point; `mean_interval` the 95%
interval of a mean of a few repeated measurements (Student's t), which
`bench serve --repeats` puts around its paired speed ratios.
"""

from __future__ import annotations

import math

import torch


def chi_square_critical(df: int, z: float = 4.0) -> float:
    """Upper quantile of chi-square(df) at the normal z-score z (Wilson-Hilferty);
    z = 4 is a false-alarm rate of about 3e-5 per check."""
    k = 2.0 / (9.0 * df)
    return df * (1.0 - k + z * math.sqrt(k)) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of observed counts against probabilities; cells with an
    expected count below 5 are pooled into one. Returns (statistic, degrees of freedom).
    Any count in a zero-probability cell makes the statistic infinite."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    if bool((counts[probs == 0] > 0).any()):
        return math.inf, 1
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, max(1, int(keep.sum()) - 1)


def wilson_interval(hits: int, tries: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% at z = 1.96); (0, 1) with no tries."""
    if tries == 0:
        return 0.0, 1.0
    p = hits / tries
    denom = 1 + z * z / tries
    centre = (p + z * z / (2 * tries)) / denom
    half = z * math.sqrt(p * (1 - p) / tries + z * z / (4 * tries * tries)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# two-sided 97.5% quantiles of Student's t by degrees of freedom (1..30); beyond 30, the normal's 1.96
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of the mean of `values` (low = high = the value
    for a single one: no spread is known)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = (T_975[n - 2] if n - 1 <= len(T_975) else 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
