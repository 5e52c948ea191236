"""Assignment 3 — parallel drafting and the Markov head: the anchor-first block, exact
left-to-right sampling of U_k + W2·W1[x_{k−1}], and the confidence head.

Fill in the five functions, then grade your work with

    python -m dspark.grade 3 walkthrough/assignments/a3_markov_head/starter.py

handout.md, next to this file, explains the method and names the check that proves each step.

You may use torch and `dspark.sampling.sample_from_probs` (inverse-CDF draw: (..., V)
probabilities and (...) uniforms in [0, 1) -> (...) token ids; draw every token with it,
so that your tokens can be compared with the reference's). Do not import
dspark.drafters.parallel or dspark.sampling.probabilities: they are the answer.

Shapes: R requests, block of γ slots, vocabulary V, backbone width D, Markov rank r.
"""

from __future__ import annotations

import torch

from dspark.sampling import sample_from_probs  # noqa: F401  (you will need it in `markov_block`)


def anchor_block(
    anchors: torch.Tensor, context_lens: torch.Tensor, gamma: int, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's input block of every request: (tokens (R, γ), positions (R, γ)), int64.

    anchors (R,) are x_0, the latest committed-but-not-yet-verified token of each request;
    context_lens (R,) how many positions each request's context holds (the anchor sits at
    position context_lens[r]). Slot k of the block predicts the token k+1 places after
    the anchor; the anchor fills slot 0 and MASK fills the others.
    """
    raise NotImplementedError


def block_visibility(context_lens: torch.Tensor, gamma: int) -> torch.Tensor:
    """(R, γ, L + γ) bool attention mask of the block, L = max(context_lens).

    Column c < L is context position c; column L + s is block slot s. A slot sees its own
    request's context strictly before the anchor, and every slot of its own block
    (attention inside the block is bidirectional).
    """
    raise NotImplementedError


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities q at this temperature.

    temperature 0 means greedy: one-hot on the argmax, ties going to the LOWEST token id.
    """
    raise NotImplementedError


def markov_step(
    u_k: torch.Tensor,
    h_k: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the Markov head: (logits (R, V), confidence (R,)).

    u_k (R, V) backbone logits U_k and h_k (R, D) backbone hidden state of slot k;
    prev (R,) int64 the previous token x_{k−1} (the anchor for the first slot);
    w1 (V, r) the lookup W1; w2 (V, r) the projection W2 stored as nn.Linear(r, V) stores
    its weight, so the sequential term is W1[x] @ w2.T; conf_weight (D + r,) and
    conf_bias (1,) the confidence head.
    logits = U_k + W2·W1[x_{k−1}];  confidence = σ(wᵀ[h_k ; W1[x_{k−1}]] + b).
    """
    raise NotImplementedError


def markov_block(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
    temperature: float,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draft a whole block left to right: (tokens (R, γ) int64, q (R, γ, V) float32, confidence (R, γ)).

    base_logits (R, γ, V) = U and hidden (R, γ, D) = h from one backbone pass; anchors (R,);
    uniforms (R, γ): draft k of request r is drawn with uniforms[r, k] from q_k, which is
    exactly the distribution returned for it.
    """
    raise NotImplementedError
