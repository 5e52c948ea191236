"""Bug: the residual is max(0, p − q) without dividing by its mass.
Caught by `residual_is_normalised` (sample_from_probs rescales by the total, so verify still agrees)."""

from __future__ import annotations

import torch
from a1_solution import verify  # noqa: F401


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    rest = torch.clamp(p - q, min=0.0)
    return torch.where(rest.sum(-1, keepdim=True) > 0, rest, p)
