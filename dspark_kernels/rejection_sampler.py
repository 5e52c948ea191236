"""Lossless verification of ragged draft blocks, one program per request (walkthrough/DESIGN.md §8, paper §5.3).

Request r brought γ drafts x_1..x_γ drawn from q_1..q_γ; the target scored
the anchor and the drafts, giving p_0..p_γ; a scheduler chose to verify only
the first ℓ_r drafts (0 <= ℓ_r <= γ, a different ℓ per request). Then:

    accept draft k  iff  u_k · q_k(x_k) < p_{k-1}(x_k)     for k = 1, 2, ... while accepted
    a = number accepted before the first rejection (or ℓ_r)
    a < ℓ_r (a real rejection):  next ~ norm(max(0, p_a − q_{a+1}))     the residual
    a = ℓ_r (all verified drafts survived):  next ~ p_a                  the bonus token

and the request emits its a accepted drafts plus `next`. The output
distribution is exactly the target's, whatever ℓ_r was.

Reference: `dspark.verify.verify_reference`.
With the same uniforms the accepted counts are identical (the test reads the
same two floats and compares them the same way) and the residual/bonus token
is identical unless a uniform lands within float round-off of a CDF boundary.

What this kernel does not do: produce the probabilities (the drafter and the
target do), or advance caches (the engine does, from `accepted`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dspark_kernels.inverse_cdf import draw_token

MAX_VOCAB = 16384  # largest vocabulary one program handles (a whole row lives in registers)


@triton.jit
def rejection_kernel(
    draft_tokens_ptr,  # (R, γ) int64: x_1..x_γ
    draft_probs_ptr,  # (R, γ, V) fp32: q_1..q_γ, the distributions the drafts were drawn from
    target_probs_ptr,  # (R, γ + 1, V) fp32: p_0..p_γ, the target's distribution after each position
    verify_lens_ptr,  # (R,) int64: ℓ_r, how many drafts of request r the target verified
    accept_uniforms_ptr,  # (R, γ) fp32: u_k of the acceptance test of draft k
    resample_uniforms_ptr,  # (R,) fp32: the uniform that draws the residual or bonus token
    accepted_ptr,  # out (R,) int64: drafts accepted, 0..ℓ_r
    next_token_ptr,  # out (R,) int64: residual sample after a rejection, else the bonus token
    gamma,  # γ, draft slots per request
    vocab_size,  # V
    BLOCK_V: tl.constexpr,  # power of two >= V
):
    request = tl.program_id(0)
    vocab = tl.arange(0, BLOCK_V)
    in_vocab = vocab < vocab_size
    verify_len = tl.minimum(tl.maximum(tl.load(verify_lens_ptr + request), 0), gamma)  # clamp to 0..γ

    # walk the verified drafts; `alive` turns False at the first rejection and stays False
    accepted = verify_len * 0
    alive = verify_len > 0
    for k in range(gamma):
        slot = request * gamma + k
        token = tl.load(draft_tokens_ptr + slot)
        q = tl.load(draft_probs_ptr + slot * vocab_size + token)  # q_k(x_k)
        p = tl.load(target_probs_ptr + (request * (gamma + 1) + k) * vocab_size + token)  # p_{k-1}(x_k)
        u = tl.load(accept_uniforms_ptr + slot)
        alive = alive & (k < verify_len) & (u * q < p)
        accepted += alive.to(tl.int64)

    # the distribution of the next token: residual after a rejection, else p_a (bonus)
    rejected = accepted < verify_len
    p_row = tl.load(
        target_probs_ptr + (request * (gamma + 1) + accepted) * vocab_size + vocab, mask=in_vocab, other=0.0
    )
    # q_{a+1}; read only after a rejection (then a < ℓ_r <= γ, so the row exists)
    q_lanes = tl.where(rejected, vocab_size, 0)  # lanes to read: all V, or none
    q_row = tl.load(
        draft_probs_ptr + (request * gamma + accepted) * vocab_size + vocab, mask=vocab < q_lanes, other=0.0
    )
    residual = tl.maximum(p_row - q_row, 0.0)
    mass = tl.sum(residual, axis=0)
    # a rejection implies positive residual mass; fall back to p only for float round-off
    residual = tl.where(mass > 0, residual / tl.maximum(mass, 1e-30), p_row)
    dist = tl.where(rejected, residual, p_row)

    next_token = draw_token(dist, vocab, vocab_size, tl.load(resample_uniforms_ptr + request))
    tl.store(accepted_ptr + request, accepted)
    tl.store(next_token_ptr + request, next_token.to(tl.int64))


def rejection_sample_triton(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    resample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted (R,) int64, next_token (R,) int64), one launch for the whole batch.

    Same arguments as `verify_reference`; all must be contiguous and on one device."""
    if draft_tokens.dim() != 2 or target_probs.dim() != 3:
        raise ValueError("draft_tokens must be (R, γ) and target_probs (R, γ + 1, V)")
    R, gamma = draft_tokens.shape
    V, device = target_probs.shape[-1], target_probs.device
    expected = {
        "draft_tokens": (draft_tokens, (R, gamma), torch.int64),
        "draft_probs": (draft_probs, (R, gamma, V), torch.float32),
        "target_probs": (target_probs, (R, gamma + 1, V), torch.float32),
        "verify_lens": (verify_lens, (R,), torch.int64),
        "accept_uniforms": (accept_uniforms, (R, gamma), torch.float32),
        "resample_uniforms": (resample_uniforms, (R,), torch.float32),
    }
    for name, (t, shape, dtype) in expected.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name} must be {dtype} of shape {shape}, got {t.dtype} {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device}")
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"vocabulary {V} outside the kernel's 1..{MAX_VOCAB}")
    # ℓ_r is not checked here (that would cost a device-to-host sync); the kernel clamps it to 0..γ

    accepted = torch.empty(R, dtype=torch.int64, device=device)
    next_token = torch.empty(R, dtype=torch.int64, device=device)
    if R == 0:
        return accepted, next_token
    # with γ = 0 the draft tensors are empty; nothing is read from them (no rejection is possible)
    drafts = draft_probs if gamma > 0 else target_probs
    rejection_kernel[(R,)](
        draft_tokens, drafts, target_probs, verify_lens, accept_uniforms, resample_uniforms,
        accepted, next_token, gamma, V,
        BLOCK_V=triton.next_power_of_2(V),
    )  # fmt: skip
    return accepted, next_token
