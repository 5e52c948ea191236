"""How a drafter learns: DSpark's objective over many packed blocks per sequence (DESIGN.md section 3).

Each anchor a forms a block [x_a, MASK × (γ−1)]; all blocks of a sequence share one backbone pass, a
block seeing the context strictly before its anchor and its own slots (`block_visibility`). The
sequential head is teacher-forced. With position weights w_k = exp(−(k−1)/4):

    loss = 0.1·L_ce + 0.9·L_tv + 1.0·BCE(c_k, c*_k)
    L_tv = ‖q_k − p_t‖₁,   c*_k = 1 − ½‖q_k − p_t‖₁ (detached)

DFlash (rank 0) trains with cross-entropy only (`DFLASH_LOSS`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import ParallelDrafter, head_loop
from dspark.model import Transformer


@dataclass
class FeatureBatch:
    """A padded batch of training sequences and the frozen target's features of every token."""

    tokens: torch.Tensor  # (B, T) int64, right-padded with 0
    lengths: torch.Tensor  # (B,) prompt + response tokens of each row
    prompt_lens: torch.Tensor  # (B,) where each response starts
    taps: torch.Tensor  # (B, T, n_taps, dim) float32, residual stream after each tap layer
    last_hidden: torch.Tensor  # (B, T, dim) float32, final-normed hidden state (LM head input)
    lse: torch.Tensor | None = None  # (B, T) float32 log-sum-exp of the target's logits (None: not known)

    def to(self, device: torch.device) -> FeatureBatch:
        """The batch on `device`; lengths and prompt lengths stay on the host (the anchor sampler reads them)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        tensors = {name: move(getattr(self, name)) for name in ("tokens", "taps", "last_hidden", "lse")}
        return replace(self, **tensors)

    def flat_features(self) -> TargetFeatures:
        """Every position of every row, flattened: taps (B·T, n_taps, dim), last_hidden (B·T, dim)."""
        return TargetFeatures(self.taps.flatten(0, 1), self.last_hidden.flatten(0, 1))


def supervised_positions(batch: FeatureBatch) -> torch.Tensor:
    """(B, T) bool: the positions j in [P, L-2], whose next token is a response token (p_t is needed there)."""
    j = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)[None, :]
    prompt_lens, lengths = batch.prompt_lens.to(j.device), batch.lengths.to(j.device)
    return (j >= prompt_lens[:, None]) & (j + 1 < lengths[:, None])


def probability_table(pieces: list[torch.Tensor], need: torch.Tensor, width: int) -> tuple[torch.Tensor, ...]:
    """(probs (N + 1, width) fp32: the N rows of `pieces` and an all-zero row, row_of (B, T)): row_of[b, j]
    is the row of position j where `need`, else N."""
    probs = torch.cat([*pieces, torch.zeros(1, width, device=need.device)])
    row_of = torch.full(need.shape, probs.shape[0] - 1, dtype=torch.long, device=need.device)
    row_of[need] = torch.arange(probs.shape[0] - 1, device=need.device)
    return probs, row_of


def supervised_target_probs(
    target: Transformer, batch: FeatureBatch, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t at the supervised positions (`supervised_positions`): (probs (N + 1, V) fp32, row_of (B, T)) as
    `probability_table` lays them out. Built `chunk` rows at a time so no (N, V) logits are held."""
    need = supervised_positions(batch)
    hidden = batch.last_hidden[need].to(target.lm_head.weight.dtype)  # (N, dim)
    with torch.no_grad():
        pieces = [
            torch.log_softmax(
                F.linear(hidden[start : start + chunk], target.lm_head.weight).float(), -1
            ).exp()
            for start in range(0, hidden.shape[0], chunk)
        ]
    return probability_table(pieces, need, target.config.vocab_size)


@dataclass(frozen=True)
class BlockLoss:
    ce: float = 0.1  # weight of the cross-entropy term
    tv: float = 0.9  # weight of the total-variation term ‖q_k − p_t‖₁
    conf: float = 1.0  # weight of the confidence head's BCE against c*_k
    soft_ce: bool = False  # cross-entropy against p_t instead of the sampled response token
    decay: float = 4.0  # position weight w_k = exp(-(k-1)/decay)


DFLASH_LOSS = BlockLoss(ce=1.0, tv=0.0, conf=0.0, decay=4.0)


def block_visibility(anchors: torch.Tensor, T: int, gamma: int) -> torch.Tensor:
    """(B, A·γ, T + A·γ) bool: a slot of block j sees context positions < anchor_j and block j's slots."""
    B, A = anchors.shape
    block_of = torch.arange(A * gamma, device=anchors.device) // gamma  # (A·γ,) which block each slot is in
    ctx = torch.arange(T, device=anchors.device)[None, None, :] < anchors[:, block_of, None]  # (B, A·γ, T)
    same = (block_of[:, None] == block_of[None, :]).expand(B, -1, -1)  # (B, A·γ, A·γ)
    return torch.cat([ctx, same], dim=-1)


def packed_backbone(
    drafter: ParallelDrafter, h_ctx: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> torch.Tensor:
    """`drafter.backbone` over all A blocks of each sequence in ONE pass, masked by `block_visibility`.
    h_ctx (B, T, dim); anchors (B, A). Returns (B, A, γ, dim)."""
    T, A, gamma = tokens.shape[1], anchors.shape[1], drafter.config.gamma
    block_pos = anchors[:, :, None] + torch.arange(gamma, device=tokens.device)  # (B, A, γ)
    block = torch.full_like(block_pos, drafter.mask_id)
    block[:, :, 0] = tokens.gather(1, anchors)  # [anchor, MASK × (γ−1)] per block
    kv = [drafter.context_kv(layer, h_ctx, torch.arange(T, device=tokens.device)) for layer in drafter.layers]
    ctx_k, ctx_v = [k.transpose(1, 2) for k, _ in kv], [v.transpose(1, 2) for _, v in kv]  # (B, Hkv, T, hd)
    visible = block_visibility(anchors, T, gamma)  # (B, A·γ, T + A·γ)
    h = drafter.backbone(block.flatten(1), block_pos.flatten(1), ctx_k, ctx_v, visible)  # (B, A·γ, dim)
    return h.unflatten(1, (A, gamma))


def soft_target_loss(
    logits: torch.Tensor, table: torch.Tensor, rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ce, l1, lse), each (R,) fp32, of logits z (R, V) against p = table[rows]: −Σ p log q, ‖q − p‖₁
    (2·TV; c* = 1 − ½·l1) and log Σ exp z, with q = softmax(z) in fp32."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    log_q, p = z - lse[:, None], table[rows]
    return -(p * log_q).sum(-1), (log_q.exp() - p).abs().sum(-1), lse


def label_cross_entropy(logits: torch.Tensor, lse: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """(R,) −log q(label) from logits (R, V), their log Σ exp (R,) and the labels (R,)."""
    return lse - logits.gather(-1, label[:, None]).squeeze(-1).float()


def packed_blocks(
    drafter: ParallelDrafter,
    target_taps: torch.Tensor,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    keep: torch.Tensor | None = None,
    last_hidden: torch.Tensor | None = None,
):
    """(h (B, A, γ, dim), U (B, A, γ, V)) of every block, or with `keep` (B, A) the kept ones' (N, γ, ·).
    target_taps (B, T, n_taps, dim); anchors (B, A)."""
    h_ctx = drafter.context_features(TargetFeatures(target_taps, last_hidden))  # (B, T, dim), as at inference
    h = packed_backbone(drafter, h_ctx, tokens, anchors)
    return drafter.block_outputs(h if keep is None else h[keep])


def block_slots(
    batch: FeatureBatch, anchors: torch.Tensor, valid_anchor: torch.Tensor, gamma: int
) -> tuple[torch.Tensor, ...]:
    """For the N kept blocks: row (N,); per slot (N, γ) the previous token's position (clamped), whether the
    predicted token exists, the previous token (teacher forcing) and the label."""
    (B, T), device = batch.tokens.shape, batch.tokens.device
    row = torch.arange(B, device=device)[:, None].expand_as(anchors)[valid_anchor]  # (N,)
    pos = anchors[valid_anchor][:, None] + torch.arange(gamma, device=device)  # (N, γ)
    valid = (pos + 1) < batch.lengths.to(device)[row][:, None]
    safe = pos.clamp(max=T - 1)
    prev = batch.tokens[row[:, None], safe]
    label = batch.tokens[row[:, None], (safe + 1).clamp(max=T - 1)]
    return row, safe, valid, prev, label


def teacher_forced(
    drafter: ParallelDrafter, h: torch.Tensor, u_logits: torch.Tensor, prev: torch.Tensor
) -> tuple[torch.Tensor, list]:
    """The sequential head over N blocks (h, U (N, γ, ·)) fed x_{k-1} = prev[:, k] (N, γ), the response's
    token whatever the head would have drawn: (logits (N·γ, V), every position at once; the γ confidences)."""
    last = prev.shape[1] - 1
    choose = lambda k, _: prev[:, min(k + 1, last)]  # noqa: E731
    logits, confs = head_loop(drafter.sequential_logits, u_logits, h, prev[:, 0], choose)
    return torch.stack(logits, 1).flatten(0, 1), confs


def weighted_terms(
    ce: torch.Tensor, tv: torch.Tensor, confs: list, valid: torch.Tensor, loss: BlockLoss
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """(total loss, mean c* per block position, the three terms) from ce, tv (N, γ), the γ confidences and the
    slots whose next token exists `valid` (N, γ): means over the supervised blocks, weighted by w_k."""
    gamma, device = ce.shape[1], ce.device
    c_star = (1 - 0.5 * tv).detach().clamp(0, 1)  # (N, γ)
    m = valid.float()
    n = m.sum(0)  # (γ,) supervised blocks per position

    def per_position(x: torch.Tensor) -> torch.Tensor:  # (N, γ) -> (γ,) mean over the supervised blocks
        return (x * m).sum(0) / n.clamp(min=1)

    terms = {"ce": per_position(ce), "tv": per_position(tv), "conf": torch.zeros(gamma, device=device)}
    if confs[0] is not None:
        c = torch.stack(confs, 1).float().clamp(1e-6, 1 - 1e-6)
        terms["conf"] = per_position(F.binary_cross_entropy(c, c_star, reduction="none"))
    w = torch.exp(-torch.arange(gamma, device=device, dtype=torch.float32) / loss.decay)  # w_k
    terms = {name: (w * value).sum() / w.sum() for name, value in terms.items()}
    c_star_by_pos = list(torch.where(n > 0, per_position(c_star), float("nan")).unbind())
    total = loss.ce * terms["ce"] + loss.tv * terms["tv"] + loss.conf * terms["conf"]
    return total, c_star_by_pos, terms


def block_losses(
    drafter: ParallelDrafter,
    target: Transformer,
    batch: FeatureBatch,
    anchors: torch.Tensor,
    valid_anchor: torch.Tensor,
    loss: BlockLoss | None = None,
    target_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """(total loss, mean c* per block position, the three terms) of the blocks at `anchors` (B, A) where
    `valid_anchor`; `target_probs`: p_t as `supervised_target_probs` gives it, if already built."""
    loss = loss or (BlockLoss() if drafter.has_confidence else DFLASH_LOSS)
    probs, row_of = target_probs or supervised_target_probs(target, batch)  # (N + 1, V), (B, T)
    h, u = packed_blocks(drafter, batch.taps, batch.tokens, anchors, valid_anchor, batch.last_hidden)
    row, safe, valid, prev, label = block_slots(batch, anchors, valid_anchor, drafter.config.gamma)
    p_row = row_of[row[:, None], safe].flatten()  # (N·γ,) row of p_t (the zero row where not supervised)
    logits, confs = teacher_forced(drafter, h, u, prev)
    ce, tv, lse = soft_target_loss(logits, probs, p_row)  # −Σ p_t log q, ‖q − p_t‖₁, log Σ exp
    if not loss.soft_ce:
        ce = label_cross_entropy(logits, lse, label.flatten())
    return weighted_terms(ce.view_as(prev), tv.view_as(prev), confs, valid, loss)
