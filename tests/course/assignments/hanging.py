"""Assignment 5, correct except that `prefix_survival` never returns (a loop without its
increment): that check must time out, every other check must still pass."""

from __future__ import annotations

from a5_solution import greedy_path, path_rates, prefix_schedule  # noqa: F401


def prefix_survival(confidences):
    out = confidences.double().clone()
    j = 1
    while j < out.shape[1]:
        out[:, j] = out[:, j - 1] * out[:, j]  # BUG: j never grows
    return out
