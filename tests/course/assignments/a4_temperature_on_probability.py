"""Bug: the temperature divides the confidence itself (c / T) instead of its logit, σ(logit(c) / T).
Caught by `calibrated_survival_values_and_order`."""

from __future__ import annotations

from a4_solution import auroc, confidence_label, ece, events_and_mask, fit_sts  # noqa: F401


def calibrated_survival(confidences, temperatures=None):
    c = confidences.double()
    if temperatures is not None:
        c = (c / temperatures.double()[: c.shape[1]]).clamp(0, 1)  # BUG: scales the probability
    return c.cumprod(dim=1)
