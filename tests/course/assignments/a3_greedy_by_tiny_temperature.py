"""Bug: greedy is implemented as a very low temperature, so tied argmaxes share the mass and the
draw may pick the higher id. Caught by `greedy_ties_go_to_the_lowest_id`."""

from __future__ import annotations

import a3_solution
import torch
from a3_solution import anchor_block, block_visibility, markov_step  # noqa: F401


def draft_probs(logits, temperature):
    return torch.softmax(logits.float() / max(temperature, 1e-4), dim=-1)  # BUG: T = 0 is not one-hot


a3_solution.draft_probs = draft_probs
markov_block = a3_solution.markov_block
