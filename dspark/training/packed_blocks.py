"""The DSpark / DFlash training objective over many packed blocks per sequence.

For a batch of target-regenerated sequences and the frozen target's features
(walkthrough/DESIGN.md section 3; paper 3.3):
  1. the features come from the feature cache (or a live target pass: the
     same numbers); p_t, the target's distribution, is computed only at the
     supervised positions (feature_cache.supervised_target_probs);
  2. the anchors a (anchors.py: response positions, no repeats) each form a
     block [x_a, MASK, ..., MASK] at positions a..a+γ-1. All blocks of a
     sequence are packed into one backbone pass: a block sees the context
     strictly before its own anchor and its own slots, never another block;
  3. the sequential head is teacher-forced (it sees the true previous token);
  4. loss = 0.1·L_ce + 0.9·L_tv + 1.0·L_conf (`BlockLoss`), each averaged with
     position weights w_k = exp(-(k-1)/decay), decay 4 as in the reference
     trainer, where L_tv = ‖q_k − p_t‖₁ and the confidence target is the
     detached c*_k = 1 − ½‖q_k − p_t‖₁. L_ce is against the sampled token, or
     with `soft_ce` against p_t. DFlash (rank 0) trains with cross-entropy
     only, its original recipe (`DFLASH_LOSS`); it has no confidence head.

What this file does not do: the optimizer loop (shared with the other drafters
in dspark/training/drafters.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark.drafters.parallel import ParallelDrafter
from dspark.model import Transformer
from dspark.training.feature_cache import FeatureBatch, supervised_target_probs


@dataclass(frozen=True)
class BlockLoss:
    ce: float = 0.1  # weight of the cross-entropy term
    tv: float = 0.9  # weight of the total-variation term ‖q_k − p_t‖₁
    conf: float = 1.0  # weight of the confidence head's BCE against c*_k
    soft_ce: bool = False  # cross-entropy against p_t instead of the sampled response token
    decay: float = 4.0  # position weight w_k = exp(-(k-1)/decay) (the paper writes γ; the reference uses 4)


DFLASH_LOSS = BlockLoss(ce=1.0, tv=0.0, conf=0.0, decay=4.0)


def block_visibility(anchors: torch.Tensor, T: int, gamma: int) -> torch.Tensor:
    """(B, A·γ, T + A·γ) bool: slot s of block j sees context positions < anchor_j and
    the γ slots of block j only."""
    B, A = anchors.shape
    block_of = torch.arange(A * gamma) // gamma  # (A·γ,) which block each slot belongs to
    ctx = torch.arange(T)[None, None, :] < anchors[:, block_of, None]  # (B, A·γ, T)
    same = (block_of[:, None] == block_of[None, :]).expand(B, -1, -1)  # (B, A·γ, A·γ)
    return torch.cat([ctx, same], dim=-1)


def packed_blocks(
    drafter: ParallelDrafter, target_taps: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
):
    """Backbone over all blocks of a batch at once: (head input h (B, A, γ, dim), U (B, A, γ, V)).

    target_taps (B, T, n_taps, dim); anchors (B, A) positions in 0..T-1."""
    B, T = tokens.shape
    A, gamma = anchors.shape[1], drafter.config.gamma
    h_ctx = drafter.ctx_norm(drafter.ctx_proj(target_taps.flatten(2)))  # (B, T, dim)
    ctx_k, ctx_v = [], []
    for layer in drafter.layers:
        k, v = drafter.context_kv(layer, h_ctx, torch.arange(T))
        ctx_k.append(k.transpose(1, 2))  # (B, Hkv, T, hd)
        ctx_v.append(v.transpose(1, 2))
    block_pos = (anchors[:, :, None] + torch.arange(gamma)).view(B, A * gamma)  # (B, A·γ)
    block = torch.full((B, A * gamma), drafter.mask_id, dtype=torch.long)
    block[:, ::gamma] = tokens.gather(1, anchors)
    h = drafter.backbone(block, block_pos, ctx_k, ctx_v, block_visibility(anchors, T, gamma))
    return drafter.block_outputs(h.view(B, A, gamma, -1))


def block_losses(
    drafter: ParallelDrafter,
    target: Transformer,
    batch: FeatureBatch,
    anchors: torch.Tensor,
    valid_anchor: torch.Tensor,
    loss: BlockLoss | None = None,
    target_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """(total loss, mean c* per block position, the three loss terms) of the blocks at `anchors`
    (B, A) where `valid_anchor` (B, A); `loss` defaults to DSpark's (DFlash: `DFLASH_LOSS`);
    `target_probs`: supervised_target_probs(target, batch) if the caller has it already."""
    B, T = batch.tokens.shape
    gamma, tokens, lengths = drafter.config.gamma, batch.tokens, batch.lengths
    loss = loss or (BlockLoss() if drafter.has_confidence else DFLASH_LOSS)
    probs, row_of = target_probs if target_probs is not None else supervised_target_probs(target, batch)
    A = anchors.shape[1]
    h, u_logits = packed_blocks(drafter, batch.taps, tokens, anchors)

    pos = anchors[:, :, None] + torch.arange(gamma)  # (B, A, γ): position of each slot's previous token
    valid = ((pos + 1) < lengths[:, None, None]) & valid_anchor[:, :, None]  # the predicted token exists
    safe = pos.clamp(max=T - 1)
    prev = tokens.gather(1, safe.view(B, -1)).view(B, A, gamma)  # teacher forcing
    label = tokens.gather(1, (safe + 1).clamp(max=T - 1).view(B, -1)).view(B, A, gamma)
    p_row = row_of.gather(1, safe.view(B, -1)).view(B, A, gamma)  # row of p_t in `probs`

    state = h.new_zeros(B * A, drafter.config.rank)
    terms = {"ce": 0.0, "tv": 0.0, "conf": 0.0}
    c_star_by_pos, w_sum = [], 0.0
    for k in range(gamma):
        logits, conf, state = drafter.sequential_logits(
            u_logits[:, :, k].flatten(0, 1), h[:, :, k].flatten(0, 1), prev[:, :, k].flatten(), state
        )
        m = valid[:, :, k].flatten()
        w = math.exp(-k / loss.decay)
        w_sum += w
        if not bool(m.any()):
            c_star_by_pos.append(torch.tensor(float("nan")))
            continue
        log_q = torch.log_softmax(logits[m].float(), dim=-1)  # (n, V) supervised slots only
        p = probs[p_row[:, :, k].flatten()[m]]  # (n, V)
        if loss.soft_ce:
            ce = -(p * log_q).sum(-1)
        else:
            ce = -log_q.gather(-1, label[:, :, k].flatten()[m][:, None]).squeeze(-1)
        tv = (log_q.exp() - p).abs().sum(-1)
        c_star = (1 - 0.5 * tv).detach().clamp(0, 1)
        terms["ce"] = terms["ce"] + w * ce.mean()
        terms["tv"] = terms["tv"] + w * tv.mean()
        if conf is not None:
            bce = F.binary_cross_entropy(conf[m].float().clamp(1e-6, 1 - 1e-6), c_star)
            terms["conf"] = terms["conf"] + w * bce
        c_star_by_pos.append(c_star.mean())
    terms = {name: value / w_sum for name, value in terms.items()}
    total = loss.ce * terms["ce"] + loss.tv * terms["tv"] + loss.conf * terms["conf"]
    return total, c_star_by_pos, terms
