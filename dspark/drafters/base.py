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
    """One round's drafts for R requests, the distributions they were drawn from, and their confidences.

    A drafter scores K ids: the target's whole vocabulary (K = V) in the core, the K most frequent with the
    lab's draft vocabulary. `q` stays over those K; `probs` puts it on the target's V ids when read (sampled
    verification reads it, greedy verification never does)."""

    tokens: torch.Tensor  # (R, γ) int64: x_1..x_γ after each anchor, target ids
    q: torch.Tensor  # (R, γ, K) fp32: q_k over the drafter's K scored ids
    confidence: torch.Tensor | None = None  # (R, γ): c_k in (0, 1) from a confidence head, else None
    vocab: nn.Module | None = None  # the drafter's vocabulary (maps q onto the target's); None: K = V

    @property
    def probs(self) -> torch.Tensor:
        """(R, γ, V) fp32 q_k over the target's vocabulary (zero off the scored ids; built on each read)."""
        return self.q if self.vocab is None else self.vocab.expand(self.q)


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


class Vocabulary(nn.Module):
    """What a drafter scores: here the target's whole vocabulary, so draft indices are target ids (the lab's
    `DraftVocabulary` scores K of them: dspark/lab/draft_vocab.py, for large real vocabularies)."""

    size = 0  # K: 0, no reduced vocabulary (the lab's has `ids`, the K target ids)

    def __init__(self, target: nn.Module) -> None:
        super().__init__()
        self._target = (target,)  # frozen and shared: its head rows are read, never trained
        self.target_vocab = self.n_out = self.n_prev = target.config.vocab_size

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., V): the target's frozen LM head."""
        target = self._target[0]
        return target.project_to_vocab(normed, target.lm_head.weight)

    def output_rows(self) -> torch.Tensor:
        """(V, dim): the target's LM-head rows."""
        return self._target[0].lm_head.weight.detach()

    def to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids <-> draft indices, and probabilities over one <-> over the other: all the identity here."""
        return ids

    to_target = expand = restrict = to_draft


def scored_vocabulary(target: nn.Module, size: int, vocab: nn.Module | None = None) -> nn.Module:
    """What a drafter built for `size` draft ids (its config's `draft_vocab`) scores: `vocab` if given (the lab's
    DraftVocabulary), else the whole vocabulary; a mismatch is a ValueError."""
    vocab = vocab if vocab is not None else Vocabulary(target)
    if vocab.size != size:
        raise ValueError(
            f"the drafter's config scores {size or 'all'} ids, its vocabulary {vocab.size or 'all'}; "
            "a reduced one is built by the lab (dspark.lab.draft_vocab.DraftVocabulary)"
        )
    return vocab


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
