"""Small statistics without SciPy: chi-square goodness of fit, and binomial intervals.

The losslessness checks (tests/, walkthrough 08) count the tokens a sampler
draws and compare them with the target's probabilities: `chi_square` gives
Pearson's statistic and its degrees of freedom, `chi_square_critical` the
threshold it must stay below. `wilson_interval` is the 95% interval the study's
acceptance-by-position figures draw around each point.
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
