"""Assignment 5 — hardware-aware scheduling: Algorithm 1 with its early stop, and why the stop matters.

Fill in the four functions, then grade your work with

    python -m dspark.grade 5 walkthrough/assignments/a5_scheduler/starter.py

handout.md, next to this file, explains the method and names the check that proves each step.

Given: `ThroughputProfile` (dspark/scheduler.py): `profile.sps(B)` is SPS(B),
target passes per second with B tokens in one pass (non-increasing in B). You may use
torch and it; do not import the project's scheduler functions, they are the answer.

Notation: R requests, γ drafts each; survivals a[r, j] (j = 0..γ-1 is draft j+1) are the
probabilities that drafts 1..j+1 of request r are all accepted, non-increasing in j.
"""

from __future__ import annotations

import torch

from dspark.scheduler import ThroughputProfile


def prefix_survival(confidences: torch.Tensor) -> torch.Tensor:
    """(R, γ) confidences c[r, j] in [0, 1] -> (R, γ) float64 survivals a[r, j] = Π_{i<=j} c[r, i]."""
    raise NotImplementedError


def greedy_path(survivals: torch.Tensor) -> torch.Tensor:
    """Every candidate (r, j) in the order Algorithm 1 admits them: (R·γ, 2) int64 rows [r, j].

    Descending survival; equal survivals go to the earlier position j first, then to the
    lower request r. (Within a request the order is then always j = 0, 1, 2, ...)
    """
    raise NotImplementedError


def path_rates(survivals: torch.Tensor, profile: ThroughputProfile) -> list[float]:
    """Θ = τ · SPS(B) after admitting the first n candidates of the greedy path, n = 0..R·γ.

    τ = Σ_r (1 + Σ_{admitted j} a[r, j]) expected tokens out of the round, the bonus or
    correction token of every request included; B = Σ_r (1 + ℓ_r) tokens in the target pass.
    Returns R·γ + 1 floats.
    """
    raise NotImplementedError


def prefix_schedule(
    survivals: torch.Tensor, profile: ThroughputProfile, early_stop: bool = True
) -> torch.Tensor:
    """(R, γ) survivals -> (R,) int64 verify lengths ℓ_r in 0..γ.

    early_stop=True is Algorithm 1: walk the greedy path from "nothing verified" and admit a
    candidate while Θ strictly improves; stop at the first candidate that does not improve it.
    early_stop=False is the retrospective variant: the n with the largest Θ over the whole
    path (the first such n on ties), which paper Appendix A shows is NOT lossless.
    """
    raise NotImplementedError
