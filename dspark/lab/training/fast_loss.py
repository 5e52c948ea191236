"""The drafter loss's CPU speed paths: `block_losses` is the core's (dspark/training.py) built from the core's
pieces with these two, over the drafter's draft vocabulary if it has one (dspark/lab/draft_vocab.py);
tests/lab/test_distribution_loss.py holds it equal to the core's plain one, values and gradients.

  * `packed_backbone`: the packed pass with the attention split the way `block_visibility` draws it: each
    slot scores the T context keys (masked at its anchor) and the γ keys of its own block only, never the
    A·γ slots of the other blocks, which the dense mask scores and discards.
  * `soft_target_loss`: CE, ‖q − p‖₁ and log Σ exp with their gradients with respect to the logits z written
    by hand, which need no autograd graph:

        ∂ce/∂z  = q·Σp − p,    ∂l1/∂z = q ∘ (s − Σ_v s_v q_v), s = sign(q − p),    ∂lse/∂z = q

    Autograd over the plain expressions keeps every intermediate (R, V) tensor -- log q, q, q − p, |q − p|,
    the gathered p -- and walks each again backwards: a dozen passes over memory for little arithmetic, the
    largest cost of a parallel drafter's training step on a CPU. Here the rows are processed a chunk at a
    time (about 1 MB of fp32 each, so they stay in cache), p is gathered from its table per chunk, and only z,
    the table and lse are kept: the backward recomputes q chunk by chunk.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import ParallelDrafter
from dspark.lab.draft_vocab import draft_vocabulary
from dspark.model import Transformer
from dspark.training import (
    BlockLoss,
    FeatureBatch,
    block_slots,
    label_cross_entropy,
    probability_table,
    supervised_positions,
    supervised_target_probs,
    teacher_forced,
    weighted_terms,
)

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


def packed_backbone(
    drafter: ParallelDrafter, h_ctx: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """`drafter.backbone` over all packed blocks, with the attention split the way `block_visibility`
    draws it: each slot scores the T context keys (masked at its anchor) and the γ keys of its own
    block only, never the A·γ slots of the other blocks (which a dense mask would score and discard).
    Returns the backbone output (B, A, γ, dim). h_ctx (B, T, dim) context features; anchors (B, A)."""
    B, T = tokens.shape
    A, gamma = anchors.shape[1], drafter.config.gamma
    device = tokens.device
    block_pos = anchors[:, :, None] + torch.arange(gamma, device=device)  # (B, A, γ)
    block = torch.full((B, A, gamma), drafter.mask_id, dtype=torch.long, device=device)
    block[:, :, 0] = tokens.gather(1, anchors)
    x = drafter.target.embed(block)  # (B, A, γ, dim)
    cos, sin = drafter.rope_cos[block_pos, None], drafter.rope_sin[block_pos, None]
    positions = torch.arange(T, device=device)
    hidden_ctx = (positions[None, None, :] >= anchors[:, :, None])[:, None, None, :, None, :]
    for layer in drafter.layers:
        attn = layer.attn
        kv_heads, rep, hd = attn.n_kv_heads, attn.n_heads // attn.n_kv_heads, attn.head_dim
        k_ctx, v_ctx = drafter.context_kv(layer, h_ctx, positions)  # (B, T, Hkv, hd)
        q, k, v = attn._qkv(layer.attn_norm(x), cos, sin)  # (B, A, γ, H | Hkv, hd)
        q = q.unflatten(3, (kv_heads, rep)) / math.sqrt(hd)  # (B, A, γ, Hkv, rep, hd)
        s_ctx = torch.einsum("bagkrd,btkd->bkragt", q, k_ctx).masked_fill(hidden_ctx, float("-inf"))
        s_blk = torch.einsum("bagkrd,bahkd->bkragh", q, k)  # (B, Hkv, rep, A, γ, γ): bidirectional
        w = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1).to(v.dtype)
        out = torch.einsum("bkragt,btkd->bagkrd", w[..., :T], v_ctx)
        out = out + torch.einsum("bkragh,bahkd->bagkrd", w[..., T:], v)
        x = x + attn.wo(out.flatten(3))
        x = x + layer.ffn(layer.ffn_norm(x))
    return x


def block_losses(
    drafter: ParallelDrafter,
    target: Transformer,
    batch: FeatureBatch,
    anchors: torch.Tensor,
    valid_anchor: torch.Tensor,
    loss: BlockLoss,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """The core's `block_losses` through `packed_backbone` and `soft_target_loss` above; with a draft vocabulary
    q and p_t are over its K ids, and p_t's mass off them counts in full in the distance."""
    vocab = draft_vocabulary(drafter)
    probs, row_of = (
        draft_target_probs(target, batch, vocab.ids) if vocab else supervised_target_probs(target, batch)
    )
    h_ctx = drafter.context_features(TargetFeatures(batch.taps, batch.last_hidden))  # (B, T, dim)
    h, u = drafter.block_outputs(packed_backbone(drafter, h_ctx, batch.tokens, anchors)[valid_anchor])
    row, safe, valid, prev, label = block_slots(batch, anchors, valid_anchor, drafter.config.gamma)
    if vocab:  # the head's rows and labels are draft indices (K: an id off the draft vocabulary)
        prev, label = vocab.to_draft(prev), vocab.to_draft(label)
    p_row, label = row_of[row[:, None], safe].flatten(), label.flatten()  # (N·γ,)
    logits, confs = teacher_forced(drafter, h, u, prev)
    ce, tv, lse = soft_target_loss(logits, probs, p_row)
    if not loss.soft_ce:
        K = logits.shape[-1]
        ce = label_cross_entropy(logits, lse, label.clamp(max=K - 1)) * (label < K)
    if vocab:
        supervised = p_row < probs.shape[0] - 1
        tv = tv + (1 - probs.sum(-1)[p_row]).clamp(min=0) * supervised
    return weighted_terms(ce.view_as(prev), tv.view_as(prev), confs, valid, loss)


def draft_target_probs(
    target: Transformer, batch: FeatureBatch, ids: torch.Tensor, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's `supervised_target_probs` at the K draft ids only (probs (N + 1, K)), still normalised over
    V: from the K head rows and the stored log-sum-exp when the batch has it, no softmax over V."""
    need = supervised_positions(batch)
    hidden, head = batch.last_hidden[need], target.lm_head.weight  # (N, dim)
    with torch.no_grad():
        if batch.lse is not None:  # K head rows and the known normaliser
            rows, lse = head[ids], batch.lse[need]  # (K, dim), (N,)
            pieces = [
                (
                    F.linear(hidden[s : s + chunk].to(rows.dtype), rows).float() - lse[s : s + chunk, None]
                ).exp()
                for s in range(0, hidden.shape[0], chunk)
            ]
        else:
            pieces = [
                torch.log_softmax(F.linear(hidden[s : s + chunk].to(head.dtype), head).float(), -1)[
                    :, ids
                ].exp()
                for s in range(0, hidden.shape[0], chunk)
            ]
    return probability_table(pieces, need, ids.shape[0])
