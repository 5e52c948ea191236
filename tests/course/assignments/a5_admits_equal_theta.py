"""Bug: Algorithm 1 admits a candidate that leaves Θ unchanged (>= instead of >).
Caught by `strict_improvement_only`."""

from __future__ import annotations

import torch
from a5_solution import greedy_path, path_rates, prefix_survival  # noqa: F401


def prefix_schedule(survivals, profile, early_stop=True):
    R = survivals.shape[0]
    lengths = torch.zeros(R, dtype=torch.long)
    if R == 0:
        return lengths
    rates = path_rates(survivals, profile)
    best = 0
    for n in range(1, len(rates)):
        if rates[n] >= rates[best]:  # BUG: a tie is not an improvement
            best = n
        elif early_stop:
            break
    for r, _ in greedy_path(survivals)[:best].tolist():
        lengths[r] += 1
    return lengths
