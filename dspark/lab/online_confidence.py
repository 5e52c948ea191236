"""Online confidence: the drafter's own top probability as c_k, with no trained head (the free alternative).

Any drafter that samples its drafts from a distribution q_k already says how sure it is: max q_k. Taken as the
confidence c_k (and calibrated by the very same STS as DSpark's trained head: its log-odds are scaled and
shifted per position, `dspark.calibration.fit_sts` through `dspark.lab.calibration.select_sts`), it feeds the
prefix survival a_k = Π c_i and Algorithm 1 like the head does. vLLM's online acceptance estimator reads the
same signal. Whether the trained head earns its place is measured by `python -m dspark.bench confidence`
(dspark/lab/study/confidence.py).

Only the confidence changes, never the drafts or q, so verification stays exact. At temperature 0 a drafter's
q is one-hot on its argmax (dspark/sampling.py): its top probability is always 1 and says nothing, so greedy
proposals are refused.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dspark.drafters.base import Drafter, Proposal


def top_probability(q: torch.Tensor) -> torch.Tensor:
    """(R, γ, K) draft distributions -> (R, γ) the largest probability of each: the drafter's certainty."""
    return q.max(dim=-1).values.float()


class OnlineConfidence(Drafter):
    """`drafter` with its confidences replaced by `top_probability` of its own q (a trained head is ignored)."""

    has_confidence = True

    def __init__(self, drafter: Drafter) -> None:
        super().__init__()
        self.drafter = drafter
        self.name = f"{drafter.name}+online"
        self.max_gamma = drafter.max_gamma

    def reset(self, n_slots: int) -> None:
        self.drafter.reset(n_slots)

    def release(self, slot: int) -> None:
        self.drafter.release(slot)

    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        if params.greedy:
            raise ValueError("the online confidence reads the drafter's own distribution, which is one-hot at "
                             "temperature 0: sample (temperature > 0) or use the trained head")  # fmt: skip
        proposal: Proposal = self.drafter.propose(
            slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator
        )
        return replace(proposal, confidence=top_probability(proposal.q))
