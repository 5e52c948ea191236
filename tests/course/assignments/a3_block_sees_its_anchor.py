"""Bug: the block's context includes the anchor's own position (<= instead of <), a position
the drafter's cache does not hold yet. Caught by `visibility_hand_worked`."""

from __future__ import annotations

import torch
from a3_solution import anchor_block, draft_probs, markov_block, markov_step  # noqa: F401


def block_visibility(context_lens, gamma):
    L = int(context_lens.max())
    sees_context = torch.arange(L)[None, :] <= context_lens[:, None]  # BUG: the anchor is not context
    context = sees_context[:, None, :].expand(-1, gamma, -1)
    block = torch.ones(len(context_lens), gamma, gamma, dtype=torch.bool)
    return torch.cat([context, block], dim=-1)
