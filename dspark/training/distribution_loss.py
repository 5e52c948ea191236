"""How far a drafter's distribution is from the target's, per row, with the gradient written by hand.

For logits z (R, V) and the target's distribution p (R, V), with q = softmax(z) in fp32:

    ce  = −Σ_v p_v log q_v        (cross-entropy against the whole distribution: `soft_ce`)
    l1  = Σ_v |q_v − p_v|         (‖q − p‖₁ = 2·TV; c* = 1 − ½·l1 is the acceptance rate at T = 1)
    lse = log Σ_v exp z_v         (so a caller takes the CE against one token as lse − z_label)

and their gradients with respect to z, which need no autograd graph:

    ∂ce/∂z  = q·Σp − p
    ∂l1/∂z  = q ∘ (s − Σ_v s_v q_v),   s = sign(q − p)
    ∂lse/∂z = q

Autograd over the plain expressions keeps every intermediate (R, V) tensor -- log q, q, q − p, |q − p|,
the gathered p -- and walks each of them again backwards: a dozen passes over memory for a tiny amount
of arithmetic, the largest cost of a parallel drafter's training step on a CPU. Here the rows are
processed a chunk at a time (about 1 MB of fp32 each, so they stay in cache), p is gathered from its
table per chunk, and only z, the table and lse are kept: the backward recomputes q chunk by chunk.

What this file does not do: weight positions, mask rows or add the confidence loss (packed_blocks.py).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 18  # fp32 elements of one chunk of rows: 1 MB


class SoftTargetLoss(torch.autograd.Function):
    """(ce, l1, lse), each (R,) fp32, of logits (R, V) against table[rows] (R, V); gradient to the logits only."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, table: torch.Tensor, rows: torch.Tensor):
        R, V = logits.shape
        chunk = max(1, CHUNK_ELEMENTS // max(V, 1))
        ce, l1, lse = (torch.empty(R, dtype=torch.float32, device=logits.device) for _ in range(3))
        for s in range(0, R, chunk):
            z = logits[s : s + chunk].float()  # fp32 logits come as they are: never written to
            p = table[rows[s : s + chunk]]
            m = torch.logsumexp(z, dim=-1, keepdim=True)
            log_q = z - m  # a new tensor, worked on in place below
            ce[s : s + chunk] = -(p * log_q).sum(-1)
            l1[s : s + chunk] = log_q.exp_().sub_(p).abs_().sum(-1)
            lse[s : s + chunk] = m.squeeze(-1)
        ctx.save_for_backward(logits, table, rows, lse)
        return ce, l1, lse

    @staticmethod
    def backward(ctx, g_ce: torch.Tensor, g_l1: torch.Tensor, g_lse: torch.Tensor):
        logits, table, rows, lse = ctx.saved_tensors
        R, V = logits.shape
        chunk = max(1, CHUNK_ELEMENTS // max(V, 1))
        grad = torch.empty_like(logits)
        for s in range(0, R, chunk):
            part = slice(s, s + chunk)
            q = (logits[part].float() - lse[part, None]).exp_()
            p = table[rows[part]]
            sign = torch.sign(q - p)
            spread = (sign * q).sum(-1, keepdim=True)  # Σ_v s_v q_v
            gc, gl = g_ce[part, None], g_l1[part, None]
            coef = sign.sub_(spread).mul_(gl).add_(gc * p.sum(-1, keepdim=True) + g_lse[part, None])
            grad[part] = coef.mul_(q).sub_(gc * p)
        return grad, None, None


def soft_target_loss(
    logits: torch.Tensor, table: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ce, l1, lse) per row of `logits` (R, V) against p = table[rows] ((N, V) fp32 rows, rows (R,) long),
    as the module docstring defines them; differentiable in the logits."""
    if logits.dim() != 2 or table.dim() != 2 or logits.shape[1] != table.shape[1]:
        raise ValueError(
            f"logits (R, V) and table (N, V) must share V: {tuple(logits.shape)}, {tuple(table.shape)}"
        )
    if rows.shape != logits.shape[:1]:
        raise ValueError(f"rows must be (R,) = ({logits.shape[0]},), got {tuple(rows.shape)}")
    return SoftTargetLoss.apply(logits, table.float(), rows)
