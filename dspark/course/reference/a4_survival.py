"""Reference solution of assignment 4 (survival estimation), built on dspark/calibration.py.

`ece`, `auroc` and `fit_sts` are the project's; the events and mask come from
`RoundStats.calibration_arrays` (dspark/requests.py), the survivals from
`scheduler.prefix_survival`, and the label c* = 1 − ½‖q − p‖₁ is the one
dspark/training.py trains the confidence head on (DESIGN §3).
What this file does not do: anything beyond adapting signatures.
"""

from __future__ import annotations

import torch

from dspark import calibration
from dspark.calibration import BINS
from dspark.requests import RoundStats
from dspark.scheduler import prefix_survival


def confidence_label(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return (1 - 0.5 * (q.float() - p.float()).abs().sum(-1)).clamp(0, 1)


def events_and_mask(
    verify_lens: torch.Tensor, accepted: torch.Tensor, gamma: int
) -> tuple[torch.Tensor, torch.Tensor]:
    rounds = RoundStats.from_lists([[int(v)] for v in verify_lens], [[int(a)] for a in accepted],
                        [[[0.5] * gamma] for _ in verify_lens])  # fmt: skip
    _, events, mask = rounds.calibration_arrays()
    return events, mask


def ece(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> float:
    return calibration.ece(pred, obs, bins)


def auroc(score: torch.Tensor, label: torch.Tensor) -> float | None:
    return calibration.auroc(score, label)


def calibrated_survival(confidences: torch.Tensor, temperatures: torch.Tensor | None = None) -> torch.Tensor:
    return prefix_survival(confidences, temperatures)


def fit_sts(confidences: torch.Tensor, events: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return calibration.fit_sts(confidences, events, mask)
