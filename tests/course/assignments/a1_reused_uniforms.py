"""Bug: the replacement after a rejection is drawn with the accept uniform u_k of the rejected
position (already conditioned on u_k·q ≥ p) instead of the request's resample uniform.
Caught by `same_as_reference_for_the_same_uniforms` and `first_token_follows_the_target`."""

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
    passes = (accept_uniforms * q_x < p_x) & (torch.arange(gamma)[None] < verify_lens[:, None])
    accepted = passes.long().cumprod(dim=1).sum(dim=1)
    rejected = accepted < verify_lens
    p_stop = target_probs[rows, accepted]
    q_stop = draft_probs[rows, accepted.clamp(max=gamma - 1)]
    dist = torch.where(rejected[:, None], residual(p_stop, q_stop), p_stop)
    u_stop = accept_uniforms[rows, accepted.clamp(max=gamma - 1)]  # BUG: reuses the accept test's uniform
    return accepted, sample_from_probs(dist, torch.where(rejected, u_stop, resample_uniforms))
