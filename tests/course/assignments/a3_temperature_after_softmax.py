"""Bug: the temperature is applied after the softmax, softmax(logits) / T, instead of to the
logits before it (not even a distribution). Caught by `draft_probs_at_a_temperature`."""

from __future__ import annotations

import a3_solution
import torch
from a3_solution import anchor_block, block_visibility, markov_step  # noqa: F401


def draft_probs(logits, temperature):
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(logits, dim=-1) / temperature  # BUG: T must divide the logits


a3_solution.draft_probs = draft_probs  # markov_block samples from it
markov_block = a3_solution.markov_block
