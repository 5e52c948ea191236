"""Bug: AUROC counts only strict wins; a tied (positive, negative) pair counts 0 instead of ½.
Caught by `auroc_ties_count_half`."""

from __future__ import annotations

from a4_solution import calibrated_survival, confidence_label, ece, events_and_mask, fit_sts  # noqa: F401


def auroc(score, label):
    positives, negatives = score[label == 1].double(), score[label == 0].double()
    if len(positives) == 0 or len(negatives) == 0:
        return None
    wins = (positives[:, None] > negatives[None, :]).double().sum()  # BUG: ties are lost
    return float(wins / (len(positives) * len(negatives)))
