"""The DSpark / DFlash training objective over many packed blocks per sequence.

For a batch of target-regenerated sequences (walkthrough/DESIGN.md section 3; paper 3.3):
  1. one frozen target pass gives the tap features (-> context keys/values for
     every position) and p_t, the target's distribution of every next token;
  2. A anchor positions a are drawn per sequence; each anchor forms a block
     [x_a, MASK, ..., MASK] at positions a..a+γ-1. All blocks of a sequence are
     packed into one backbone pass: a block sees the context strictly before
     its own anchor and its own slots, never another block;
  3. the sequential head is teacher-forced (it sees the true previous token);
  4. loss = 0.1·L_ce + 0.9·L_tv + 1.0·L_conf, each averaged with position
     weights w_k = exp(-(k-1)/γ), where L_tv = ‖q_k − p_t‖₁ and the confidence
     target is the detached c*_k = 1 − ½‖q_k − p_t‖₁. DFlash (rank 0) trains
     with cross-entropy only, its original recipe.

What this file does not do: the optimizer loop (shared with the other drafters
in dspark/training/drafters.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dspark.drafters.parallel import ParallelDrafter
from dspark.model import Transformer

LOSS_WEIGHTS = {"ce": 0.1, "tv": 0.9, "conf": 1.0}
DFLASH_LOSS_WEIGHTS = {"ce": 1.0, "tv": 0.0, "conf": 0.0}


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
    """Backbone over all blocks of a batch at once: (h (B, A, γ, dim), U (B, A, γ, V)).

    target_taps (B, T, n_taps, dim); anchors (B, A) positions in 1..T-1."""
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
    h = drafter.backbone(block, block_pos, ctx_k, ctx_v, block_visibility(anchors, T, gamma)).view(
        B, A, gamma, -1
    )
    return h, drafter.target.lm_head(drafter.out_norm(h))


def block_losses(
    drafter: ParallelDrafter,
    target: Transformer,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    anchors_per_seq: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """(total loss, mean c* per block position, the three loss terms)."""
    B, T = tokens.shape
    gamma = drafter.config.gamma
    with torch.no_grad():
        out = target(tokens, return_taps=True)
        p_target = torch.softmax(out.logits.float(), dim=-1)  # (B, T, V): token t+1
    # anchors in [1, len-2]: at least one context position and one token to predict
    u = torch.rand(B, anchors_per_seq, generator=generator)
    anchors = 1 + (u * (lengths[:, None] - 2).clamp(min=1)).long()  # (B, A)
    A = anchors_per_seq
    offsets = torch.arange(gamma)
    h, u_logits = packed_blocks(drafter, out.taps, tokens, anchors)

    pos = anchors[:, :, None] + offsets  # (B, A, γ): position of each slot's previous token
    valid = (pos + 1) < lengths[:, None, None]  # the predicted token exists
    safe = pos.clamp(max=T - 1)
    prev = tokens.gather(1, safe.view(B, -1)).view(B, A, gamma)  # teacher forcing
    label = tokens.gather(1, (safe + 1).clamp(max=T - 1).view(B, -1)).view(B, A, gamma)
    p_t = p_target[torch.arange(B)[:, None, None], safe]  # (B, A, γ, V)

    weights = LOSS_WEIGHTS if drafter.config.rank > 0 else DFLASH_LOSS_WEIGHTS
    state = h.new_zeros(B * A, drafter.config.rank)
    terms = {"ce": 0.0, "tv": 0.0, "conf": 0.0}
    c_star_by_pos, w_sum = [], 0.0
    for k in range(gamma):
        logits, conf, state = drafter.sequential_logits(
            u_logits[:, :, k].flatten(0, 1), h[:, :, k].flatten(0, 1), prev[:, :, k].flatten(), state
        )
        log_q = torch.log_softmax(logits.float(), dim=-1)
        m = valid[:, :, k].flatten()
        p = p_t[:, :, k].flatten(0, 1)
        ce = -log_q.gather(-1, label[:, :, k].flatten()[:, None]).squeeze(-1)
        tv = (log_q.exp() - p).abs().sum(-1)
        c_star = (1 - 0.5 * tv).detach().clamp(0, 1)
        bce = F.binary_cross_entropy(conf.float().clamp(1e-6, 1 - 1e-6), c_star, reduction="none")
        w = math.exp(-k / gamma)
        w_sum += w
        if bool(m.any()):
            terms["ce"] = terms["ce"] + w * ce[m].mean()
            terms["tv"] = terms["tv"] + w * tv[m].mean()
            terms["conf"] = terms["conf"] + w * bce[m].mean()
            c_star_by_pos.append(c_star[m].mean())
        else:
            c_star_by_pos.append(torch.tensor(float("nan")))
    terms = {name: value / w_sum for name, value in terms.items()}
    total = sum(weights[name] * terms[name] for name in terms)
    return total, c_star_by_pos, terms
