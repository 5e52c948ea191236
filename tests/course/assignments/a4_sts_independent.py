"""Bug: STS fits every position on its own, against the RAW earlier confidences (T_1..T_{k−1}
left at 1 while fitting T_k) instead of left to right. Caught by `sts_matches_the_reference_search`."""

from __future__ import annotations

import torch
from a4_solution import (  # noqa: F401
    auroc,
    best_temperature,
    calibrated_survival,
    confidence_label,
    ece,
    events_and_mask,
)


def fit_sts(confidences, events, mask):
    gamma = confidences.shape[1]
    temps = torch.ones(gamma, dtype=torch.float64)
    raw_before = torch.cat([torch.ones(len(confidences), 1), confidences.double().cumprod(1)[:, :-1]], dim=1)
    for k in range(gamma):
        rows = mask[:, k]
        if not rows.any():
            break
        # BUG: the earlier positions enter uncalibrated, whatever was fitted for them
        temps[k] = best_temperature(raw_before[rows, k], confidences[rows, k], events[rows, k])
    return temps
