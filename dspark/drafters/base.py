"""The contract between the speculative loop and every drafter.

After each target pass the loop knows, per request, the positions that were
just *committed* (fed to the target and kept): their tokens and the target's
features there (tap-layer hidden states and the final hidden), plus the new
*anchor*: the token sampled after them, not yet fed to the target. A drafter
call receives exactly that and returns γ draft tokens after the anchor with
the distributions they were sampled from, and -- if it has a trained
confidence head -- its confidence in each draft, all in one `Proposal`:

    propose(slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator)
        -> Proposal(tokens (R, γ), probs (R, γ, V), confidence (R, γ) or None)

The loop hands that Proposal, unchanged, to the verify-length policy
(dspark/scheduling/scheduler.py) and to `verify`; nobody reads a drafter's
attributes to learn what it proposed. `has_confidence` says up front whether
its proposals carry confidences, so that a policy that needs them can refuse
the drafter before anything runs.

Every tensor a drafter makes lives on its inputs' device (that of `slots`,
= its own weights' and the target's; dspark/device.py).

At prefill the committed positions are the whole prompt. Drafters keep any
per-request state they need (their own KV caches, context features) indexed by
the target's cache slot, and are responsible for discarding whatever they
computed for their own drafts (rolling back to the committed length).

`NoDrafter` proposes nothing (γ = 0): the speculative loop then *is* plain
decoding, which the tests use as a reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dspark.sampling import SamplingParams


class Proposal:
    """One round's drafts for R requests: everything the policy and `verify` need from the drafter.

    tokens (R, γ) int64: draft tokens x_1..x_γ after each anchor.
    probs (R, γ, V) fp32: q_k, the exact distributions the tokens were sampled from. A drafter may hand a
        function that builds them instead: it runs on the first read of `probs`. With a reduced draft
        vocabulary q lives on K ids and its full-vocabulary copy is a large write (16 requests x 7 drafts
        x 49k ids), which greedy verification (it compares ids) never reads.
    confidence (R, γ): c_k in (0, 1) from a trained confidence head, else None.
    drafted (R,) bool: which rows really drafted this step (None: all). The engine fills the rows of
        requests that did not draft (speculate-or-not, dspark/lab/cost_aware/scheduler.py) with zeros; they
        verify nothing."""

    def __init__(
        self,
        tokens: torch.Tensor,
        probs: torch.Tensor | Callable[[], torch.Tensor],
        confidence: torch.Tensor | None = None,
        drafted: torch.Tensor | None = None,
    ) -> None:
        self.tokens, self._probs, self.confidence, self.drafted = tokens, probs, confidence, drafted

    @property
    def probs(self) -> torch.Tensor:
        """(R, γ, V) fp32 q_k (built now if the drafter handed a function, once)."""
        if callable(self._probs):
            self._probs = self._probs()
        return self._probs


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
        """(..., n_taps * dim) the taps side by side (any leading dims: (N, ·) at inference, (B, T, ·) in
        packed training)."""
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
        raise ValueError(f"the drafter's config scores {size or 'all'} ids, its vocabulary {vocab.size or 'all'}; "
                         "a reduced one is built by the lab (dspark.lab.draft_vocab.DraftVocabulary)")  # fmt: skip
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
        """slots (R,); committed_tokens (N,) flat, slot-major; features for those N
        positions; committed_lens (R,) with sum N; anchors (R,). Returns the draft
        tokens (R, gamma) int64, their fp32 distributions (R, gamma, V) and, where
        `has_confidence`, the confidences (R, gamma)."""
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
