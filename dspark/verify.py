"""Lossless verification of draft tokens: speculative rejection sampling (walkthrough/DESIGN.md §8).

Request r drafted x_1..x_γ from q_1..q_γ; the target's one pass gave p_0..p_γ (`target_probs[:, k]` is for
draft position k+1). Only the first ℓ_r ∈ 0..γ drafts (the scheduler's choice) are verified. Left to right,
draft k is accepted when u_k · q_k(x_k) < p_{k-1}(x_k), i.e. with probability min(1, p/q); at the first
rejection a token is drawn from norm(max(0, p_{k-1} − q_k)), else a bonus from p_ℓ. The round yields
accepted + 1 tokens, distributed exactly as the target's. All randomness comes in as uniforms; at T = 0
(one-hot p and q) `verify_greedy` gives the same answer from argmax ids alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.device import generator_uniforms
from dspark.sampling import sample_from_probs
from dspark_kernels import use_kernel


@dataclass
class VerifyResult:
    accepted: torch.Tensor  # (R,) int64: drafts accepted, 0..verify_lens[r]
    next_token: torch.Tensor  # (R,) int64: residual sample after a rejection, else the bonus token


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    resample_uniforms: torch.Tensor,
) -> VerifyResult:
    """`verify_reference`, or the Triton kernel where `use_kernel` picks it (CUDA tensors by default)."""
    if use_kernel(draft_probs, target_probs):
        from dspark_kernels.rejection_sampler import rejection_sample_triton

        accepted, next_token = rejection_sample_triton(
            draft_tokens, draft_probs, target_probs, verify_lens, accept_uniforms, resample_uniforms
        )
        return VerifyResult(accepted, next_token)
    return verify_reference(
        draft_tokens, draft_probs, target_probs, verify_lens, accept_uniforms, resample_uniforms
    )


def verify_reference(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    resample_uniforms: torch.Tensor,
) -> VerifyResult:
    """Batched, ragged speculative verification in PyTorch (the reference).

    draft_tokens (R, γ) int64; draft_probs (R, γ, V) fp32, the q each draft was sampled from; target_probs
    (R, γ+1, V) fp32; verify_lens (R,) in 0..γ; accept_uniforms (R, γ), resample_uniforms (R,) in [0, 1).
    Drafts beyond verify_lens[r] are ignored. No host reads."""
    R, gamma = draft_tokens.shape
    assert target_probs.shape == (R, gamma + 1, draft_probs.shape[-1]), "target_probs must be (R, γ+1, V)"
    assert draft_probs.dtype == target_probs.dtype == torch.float32, "p and q in fp32, as tokens were drawn"
    rows = torch.arange(R, device=draft_tokens.device)
    if gamma > 0:
        tok = draft_tokens.unsqueeze(-1)
        q = draft_probs.gather(-1, tok).squeeze(-1)  # (R, γ) q_k(x_k)
        p = target_probs[:, :gamma].gather(-1, tok).squeeze(-1)  # (R, γ) p_{k-1}(x_k)
        accepted = accepted_prefix(accept_uniforms * q < p, verify_lens)  # (R,)
    else:
        accepted = torch.zeros(R, dtype=torch.long, device=draft_tokens.device)

    rejected = accepted < verify_lens  # (R,) stopped by a real rejection, not by ℓ_r
    p_next = target_probs[rows, accepted]  # (R, V) target distribution at the stop
    if gamma > 0:
        q_next = draft_probs[rows, accepted.clamp(max=gamma - 1)]
        residual = (p_next - q_next).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        # a rejection implies positive residual mass; fall back to p for round-off only
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
        dist = torch.where(rejected[:, None], residual, p_next)
    else:
        dist = p_next
    next_token = sample_from_probs(dist, resample_uniforms)
    return VerifyResult(accepted, next_token)


def accepted_prefix(ok: torch.Tensor, verify_lens: torch.Tensor) -> torch.Tensor:
    """(R, γ) bool per-draft acceptance -> (R,) drafts accepted: the all-True prefix, cut at ℓ_r
    (unverified drafts count as stops)."""
    position = torch.arange(ok.shape[1], device=ok.device)
    ok = ok & (position[None, :] < verify_lens[:, None])
    return torch.cumprod(ok.long(), dim=1).sum(dim=1)


def verify_greedy(
    draft_tokens: torch.Tensor, target_top: torch.Tensor, verify_lens: torch.Tensor
) -> VerifyResult:
    """`verify_reference` at temperature 0, without (R, γ+1, V) one-hots: draft_tokens (R, γ), target_top
    (R, γ+1) the target's argmax ids, verify_lens (R,). A draft is accepted when it equals the target's
    choice; the next token is the target's choice at the stop. No uniforms: at T = 0 they do not matter."""
    R, gamma = draft_tokens.shape
    assert target_top.shape == (R, gamma + 1), "target_top must be (R, γ+1)"
    accepted = accepted_prefix(draft_tokens == target_top[:, :gamma], verify_lens)  # (R,)
    next_token = target_top.gather(1, accepted[:, None]).squeeze(1)  # (R,)
    return VerifyResult(accepted, next_token)


def draw_uniforms(
    n_requests: int, gamma: int, generator: torch.Generator, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh accept (R, γ) and resample (R,) uniforms for one round, on `device` (`generator_uniforms`)."""
    device = torch.device(device)
    accept = generator_uniforms((n_requests, gamma), generator, device)  # (R, γ)
    resample = generator_uniforms((n_requests,), generator, device)  # (R,)
    return accept, resample
