"""Bug: the accept walk runs over all γ drafts, ignoring verify_lens (unverified drafts get accepted).
Caught by `verify_lengths_0_1_gamma_minus_1_gamma`."""

from __future__ import annotations

import torch
from a1_solution import residual

from dspark.sampling import sample_from_probs


def verify(draft_tokens, draft_probs, target_probs, verify_lens, accept_uniforms, resample_uniforms):
    R, gamma = draft_tokens.shape
    rows = torch.arange(R)
    if gamma == 0:
        return torch.zeros(R, dtype=torch.long), sample_from_probs(target_probs[:, 0], resample_uniforms)
    q_x = draft_probs.gather(2, draft_tokens[..., None])[..., 0]
    p_x = target_probs[:, :gamma].gather(2, draft_tokens[..., None])[..., 0]
    passes = accept_uniforms * q_x < p_x  # BUG: no mask for positions beyond verify_lens
    accepted = passes.long().cumprod(dim=1).sum(dim=1)
    rejected = accepted < gamma
    p_stop = target_probs[rows, accepted]
    q_stop = draft_probs[rows, accepted.clamp(max=gamma - 1)]
    dist = torch.where(rejected[:, None], residual(p_stop, q_stop), p_stop)
    return accepted, sample_from_probs(dist, resample_uniforms)
