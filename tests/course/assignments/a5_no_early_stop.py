"""Bug: Algorithm 1 without its early stop -- the best Θ over the whole path is taken whatever
`early_stop` says. Caught by `early_stop_halts_at_the_first_drop` and
`appendix_a_algorithm_1_is_lossless`."""

from __future__ import annotations

import torch
from a5_solution import greedy_path, path_rates, prefix_survival  # noqa: F401


def prefix_schedule(survivals, profile, early_stop=True):
    R = survivals.shape[0]
    lengths = torch.zeros(R, dtype=torch.long)
    if R == 0:
        return lengths
    rates = path_rates(survivals, profile)
    best = max(range(len(rates)), key=lambda n: (rates[n], -n))  # BUG: looks at the whole path
    for r, _ in greedy_path(survivals)[:best].tolist():
        lengths[r] += 1
    return lengths
