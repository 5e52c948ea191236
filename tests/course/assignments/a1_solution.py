"""Assignment 1, solved from scratch (no dspark.verify): the base of the a1_* planted bugs."""

from __future__ import annotations

import torch

from dspark.sampling import sample_from_probs


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    rest = torch.clamp(p - q, min=0.0)
    mass = rest.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, rest / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def verify(draft_tokens, draft_probs, target_probs, verify_lens, accept_uniforms, resample_uniforms):
    R, gamma = draft_tokens.shape
    rows = torch.arange(R)
    if gamma == 0:
        return torch.zeros(R, dtype=torch.long), sample_from_probs(target_probs[:, 0], resample_uniforms)
    q_x = draft_probs.gather(2, draft_tokens[..., None])[..., 0]  # q_k(x_k)
    p_x = target_probs[:, :gamma].gather(2, draft_tokens[..., None])[..., 0]  # p_{k-1}(x_k)
    passes = (accept_uniforms * q_x < p_x) & (torch.arange(gamma)[None] < verify_lens[:, None])
    accepted = passes.long().cumprod(dim=1).sum(dim=1)
    p_stop = target_probs[rows, accepted]
    q_stop = draft_probs[rows, accepted.clamp(max=gamma - 1)]
    rejected = accepted < verify_lens
    dist = torch.where(rejected[:, None], residual(p_stop, q_stop), p_stop)
    return accepted, sample_from_probs(dist, resample_uniforms)
