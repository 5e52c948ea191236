"""The contract between the speculative loop and every drafter.

A drafter gets, per request, the positions just *committed* (their tokens and the target's features there;
the whole prompt at prefill) and the *anchor* (the token sampled after them), and returns γ drafts after it:

    propose(slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator)
        -> Proposal(tokens (R, γ), q (R, γ, V), confidence (R, γ) or None)

The Proposal goes unchanged to the verify-length policy and to `verify`. A drafter keeps its per-request
state by the target's cache slot, rolls back what it built from its own drafts, and makes every tensor on
the device of `slots`. `NoDrafter` (γ = 0) turns the loop into plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dspark.sampling import SamplingParams


@dataclass
class Proposal:
    """One round's drafts for R requests, the distributions they were drawn from, and their confidences."""

    tokens: torch.Tensor  # (R, γ) int64: x_1..x_γ after each anchor, target ids
    q: torch.Tensor  # (R, γ, V) fp32: q_k, the distribution x_k was drawn from
    confidence: torch.Tensor | None = None  # (R, γ): c_k in (0, 1) from a confidence head, else None

    @property
    def probs(self) -> torch.Tensor:
        """(R, γ, V) fp32 q_k over the target's vocabulary, what verification compares with p (the lab's
        reduced-vocabulary proposals draw over K ids and expand here)."""
        return self.q


@dataclass
class TargetFeatures:
    taps: torch.Tensor  # (N, n_taps, dim) residual stream after the target's tap layers
    last_hidden: torch.Tensor  # (N, dim) final-normed hidden state (input of the LM head)

    def split(self, lens: list[int]) -> list[TargetFeatures]:
        return [TargetFeatures(t, h) for t, h in zip(self.taps.split(lens), self.last_hidden.split(lens))]

    def take(self, n: int) -> TargetFeatures:
        """The first n positions."""
        return TargetFeatures(self.taps[:n], self.last_hidden[:n])

    def flat(self) -> torch.Tensor:
        """(..., n_taps * dim): the taps side by side."""
        return self.taps.flatten(-2)


class Drafter(nn.Module):
    """Base class; subclasses implement `reset`, `propose` and optionally `release`."""

    name = "base"
    max_gamma = 0  # longest block this drafter can propose
    has_confidence = False  # do its proposals carry confidences from a trained head?

    def reset(self, n_slots: int) -> None:
        """Allocate per-slot state for a cache with `n_slots` slots (forgets everything)."""

    def release(self, slot: int) -> None:
        """Forget the request that owned `slot` (the slot will be reused)."""

    def propose(
        self,
        slots: torch.Tensor,
        committed_tokens: torch.Tensor,
        features: TargetFeatures,
        committed_lens: torch.Tensor,
        anchors: torch.Tensor,
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> Proposal:
        """slots (R,); committed_tokens (N,) slot-major with features for them; committed_lens (R,) summing
        to N; anchors (R,). Returns a `Proposal`."""
        raise NotImplementedError


class NoDrafter(Drafter):
    """Proposes no tokens: speculative decoding degenerates to plain decoding."""

    name = "none"

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        R = slots.shape[0]
        return Proposal(slots.new_zeros(R, 0), torch.zeros(R, 0, self.vocab_size, device=slots.device))
