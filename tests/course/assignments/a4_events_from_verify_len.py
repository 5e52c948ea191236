"""Bug: the event at position k is "k was verified" (k ≤ ℓ) instead of "drafts 1..k all accepted"
(k ≤ a). Caught by `events_and_mask_hand_worked`."""

from __future__ import annotations

import torch
from a4_solution import auroc, calibrated_survival, confidence_label, ece, fit_sts  # noqa: F401


def events_and_mask(verify_lens, accepted, gamma):
    k = torch.arange(1, gamma + 1)[None, :]
    verified = k <= verify_lens[:, None]
    return verified.double(), verified  # BUG: the events ignore what was accepted
