"""Assignment 4 — survival estimation: the confidence label, the events, ECE, AUROC and
Sequential Temperature Scaling (STS).

Fill in the six functions, then grade your work with

    python -m dspark.grade 4 walkthrough/assignments/a4_survival/starter.py

handout.md, next to this file, explains the method and names the check that proves each step.
Use torch only: dspark/calibration.py is the answer.

Notation: N recorded request-rounds, γ draft positions; index k = 0..γ-1 is position k+1.
"""

from __future__ import annotations

import torch

BINS = 15  # equal-width reliability bins of ECE
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)  # STS searches these: 0.03 .. 31.6
TOLERANCE = 0.002  # STS: temperatures whose ECE is within this of the best are "as good"


def confidence_label(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(..., V) draft and target distributions -> (...) c* = 1 − ½‖q − p‖₁, the probability
    that a token drawn from q survives verification against p."""
    raise NotImplementedError


def events_and_mask(
    verify_lens: torch.Tensor, accepted: torch.Tensor, gamma: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) verify lengths ℓ and accepted counts a of N rounds -> (events, mask), both (N, γ).

    events[n, k] (float64) is 1.0 when drafts 1..k+1 were all accepted, else 0.0;
    mask[n, k] (bool) says whether position k+1 was verified at all in round n.
    """
    raise NotImplementedError


def ece(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> float:
    """Expected calibration error of predictions in [0, 1] against 0/1 outcomes.

    Equal-width bins over [0, 1] (a prediction of exactly 1 falls in the last bin); each
    bin contributes |mean prediction − observed frequency| weighted by its share of the N
    predictions."""
    raise NotImplementedError


def auroc(score: torch.Tensor, label: torch.Tensor) -> float | None:
    """Probability that a random positive (label 1) scores above a random negative (label 0);
    a tie counts ½. None when there are no positives or no negatives."""
    raise NotImplementedError


def calibrated_survival(confidences: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    """(N, γ) raw confidences c -> (N, γ) float64 survivals a_k = Π_{i<=k} c̃_i, where
    c̃_i = σ(logit(c_i) / T_i) with the (γ,) temperatures (None: c̃ = c). Clip c to
    [1e-12, 1 − 1e-12] before the logit, so that 0 and 1 stay finite."""
    raise NotImplementedError


def fit_sts(confidences: torch.Tensor, events: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(γ,) float64 STS temperatures, fitted left to right.

    For k = 1..γ in turn, with T_1..T_{k−1} already fixed, pick T_k from TEMPERATURE_GRID to
    minimise the ECE of the survival a_k against events[:, k−1], over the rounds that verified
    position k (mask). Among the temperatures within TOLERANCE of the best ECE, take the one
    closest to 1 (in log scale). If no round verified position k, stop: T_k.. stay 1.
    """
    raise NotImplementedError
