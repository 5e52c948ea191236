"""Reference solution of assignment 3 (the Markov head), built on dspark/drafters/parallel.py.

`markov_step` and `markov_block` are the project's `markov_step` and
`markov_block_reference`; `draft_probs` is `dspark.sampling.probabilities`; the block and
its mask are what `ParallelDrafter.draft_block` builds, the mask via
`dspark.training.block_visibility` with one block per request (DESIGN §2).
What this file does not do: anything beyond adapting signatures.
"""

from __future__ import annotations

import torch

from dspark.drafters import parallel
from dspark.sampling import SamplingParams, probabilities
from dspark.training import block_visibility as packed_visibility


def anchor_block(
    anchors: torch.Tensor, context_lens: torch.Tensor, gamma: int, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.full((anchors.shape[0], gamma), mask_id, dtype=torch.long)
    tokens[:, 0] = anchors
    return tokens, context_lens[:, None] + torch.arange(gamma)


def block_visibility(context_lens: torch.Tensor, gamma: int) -> torch.Tensor:
    return packed_visibility(context_lens[:, None], int(context_lens.max()), gamma)


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return probabilities(logits, SamplingParams(temperature=temperature))


def markov_step(
    u_k: torch.Tensor,
    h_k: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return parallel.markov_step(u_k, h_k, prev, w1, w2, conf_weight, conf_bias)


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
    params = SamplingParams(temperature=temperature)
    return parallel.markov_block_reference(
        base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, params, uniforms
    )
