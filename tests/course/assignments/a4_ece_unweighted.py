"""Bug: ECE averages the bins' gaps without weighting them by bin size.
Caught by `ece_weights_bins_by_size` (the hand-worked case has two bins of equal size)."""

from __future__ import annotations

import a4_solution
import torch
from a4_solution import auroc, calibrated_survival, confidence_label, events_and_mask  # noqa: F401


def ece(pred, obs, bins=15):
    pred, obs = pred.double(), obs.double()
    which = torch.clamp((pred * bins).floor().long(), 0, bins - 1)
    gaps = [
        (pred[which == b].mean() - obs[which == b].mean()).abs() for b in range(bins) if (which == b).any()
    ]
    return float(sum(gaps) / len(gaps))  # BUG: every non-empty bin weighs the same


a4_solution.ece = ece  # fit_sts searches with this ECE
fit_sts = a4_solution.fit_sts
