"""Assignment 1 — lossless verification: batched, ragged speculative rejection sampling.

Fill in `residual` and `verify`, then grade your work with

    python -m dspark.grade 1 walkthrough/assignments/a1_verification/starter.py

(or copy this file anywhere and pass its path). handout.md, next to this file,
explains the method and names the check that proves each step.

You may use torch and `dspark.sampling.sample_from_probs` (the project's inverse-CDF
draw: given (..., V) probabilities and (...) uniforms in [0, 1) it returns (...) token
ids; use it for every draw so that your tokens can be compared with the reference's).
Do not import dspark.verify: it is the answer.

Shapes: R requests, γ drafts each, vocabulary V. Index k = 0..γ-1 is draft position k+1.
"""

from __future__ import annotations

import torch

from dspark.sampling import sample_from_probs  # noqa: F401  (you will need it in `verify`)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution a rejected draft is replaced from: norm(max(0, p − q)).

    p, q: (..., V) float32 target and draft distributions over the same vocabulary.
    Returns (..., V) float32 rows that sum to 1. Where max(0, p − q) has no mass at all
    (p = q: a rejection cannot happen there), return p instead of dividing by zero.
    """
    raise NotImplementedError


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    resample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify the first verify_lens[r] drafts of every request r; return (accepted, next_token).

    draft_tokens      (R, γ) int64: x_1..x_γ after each request's anchor
    draft_probs       (R, γ, V) float32: row k is q_{k+1}, the distribution x_{k+1} was drawn from
    target_probs      (R, γ+1, V) float32: row k is the target's distribution for draft
                      position k+1 (row 0 comes from the anchor); row γ follows the last draft
    verify_lens       (R,) int64 in 0..γ: how many drafts request r sends to verification;
                      drafts beyond it must not influence anything
    accept_uniforms   (R, γ) in [0, 1): u_k, one per draft position, for the accept test
    resample_uniforms (R,) in [0, 1): the one uniform of request r's final draw (residual or bonus)

    Returns accepted (R,) int64 in 0..verify_lens[r] (the length of the accepted prefix) and
    next_token (R,) int64: after a rejection a draw from the residual, otherwise the bonus token.
    """
    raise NotImplementedError
