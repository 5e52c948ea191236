"""How a drafter learns: DSpark's objective over many packed blocks per sequence (DESIGN.md section 3).

Each anchor a forms a block [x_a, MASK × (γ−1)]; all blocks of a sequence share one backbone pass, a
block seeing the context strictly before its anchor and its own slots (`block_visibility`). The
sequential head is teacher-forced. With position weights w_k = exp(−(k−1)/4):

    loss = 0.1·L_ce + 0.9·L_tv + 1.0·BCE(c_k, c*_k)
    L_tv = ‖q_k − p_t‖₁,   c*_k = 1 − ½‖q_k − p_t‖₁ (detached)

DFlash (rank 0) trains with cross-entropy only (`DFLASH_LOSS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from dspark.drafters.base import TargetFeatures, Vocabulary
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


def supervised_target_probs(
    target: Transformer, batch: FeatureBatch, ids: torch.Tensor | None = None, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t at the supervised positions j in [P, L-2]: (probs (N + 1, V) fp32, row_of (B, T)), row_of[b, j]
    its row or N, an all-zero row. With `ids` (K,) only those columns, still normalised over V. Built
    `chunk` rows at a time so no (N, V) tensor is held."""
    B, T = batch.tokens.shape
    device = batch.tokens.device
    j = torch.arange(T, device=device)[None, :]
    prompt_lens, lengths = batch.prompt_lens.to(device), batch.lengths.to(device)
    need = (j >= prompt_lens[:, None]) & (j + 1 < lengths[:, None])  # (B, T)
    hidden = batch.last_hidden[need]  # (N, dim)
    pieces = []
    with torch.no_grad():
        if ids is not None and batch.lse is not None:  # K head rows and the known normaliser: no softmax
            rows, lse = target.lm_head.weight[ids], batch.lse[need]  # (K, dim), (N,)
            for start in range(0, hidden.shape[0], chunk):
                logits = F.linear(hidden[start : start + chunk].to(rows.dtype), rows).float()  # (n, K)
                pieces.append((logits - lse[start : start + chunk, None]).exp())
        else:
            for start in range(0, hidden.shape[0], chunk):
                logits = target.lm_head(
                    hidden[start : start + chunk].to(target.lm_head.weight.dtype)
                )  # (n, V)
                log_p = torch.log_softmax(logits.float(), dim=-1)
                pieces.append((log_p if ids is None else log_p[:, ids]).exp())
    width = target.config.vocab_size if ids is None else ids.shape[0]
    probs = torch.cat([*pieces, hidden.new_zeros(1, width, dtype=torch.float32)])  # (N + 1, V or K)
    row_of = torch.full((B, T), probs.shape[0] - 1, dtype=torch.long, device=device)
    row_of[need] = torch.arange(probs.shape[0] - 1, device=device)
    return probs, row_of


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


def packed_blocks(
    drafter: ParallelDrafter,
    target_taps: torch.Tensor,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    keep: torch.Tensor | None = None,
    last_hidden: torch.Tensor | None = None,
    backbone: Callable = packed_backbone,
):
    """(h (B, A, γ, dim), U (B, A, γ, V)) of every block, or with `keep` (B, A) the kept ones' (N, γ, ·).
    target_taps (B, T, n_taps, dim); anchors (B, A)."""
    h_ctx = drafter.context_features(TargetFeatures(target_taps, last_hidden))  # (B, T, dim), as at inference
    h = backbone(drafter, h_ctx, tokens, anchors)
    return drafter.block_outputs(h if keep is None else h[keep])


def block_slots(
    batch: FeatureBatch, anchors: torch.Tensor, valid_anchor: torch.Tensor, gamma: int, vocab: Vocabulary
) -> tuple[torch.Tensor, ...]:
    """For the N kept blocks: row (N,); per slot (N, γ) the previous token's position (clamped), whether the
    predicted token exists, the previous token (teacher forcing) and the label, both in draft indices."""
    (B, T), device = batch.tokens.shape, batch.tokens.device
    row = torch.arange(B, device=device)[:, None].expand_as(anchors)[valid_anchor]  # (N,)
    pos = anchors[valid_anchor][:, None] + torch.arange(gamma, device=device)  # (N, γ)
    valid = (pos + 1) < batch.lengths.to(device)[row][:, None]
    safe = pos.clamp(max=T - 1)
    prev = vocab.to_draft(batch.tokens[row[:, None], safe])
    label = vocab.to_draft(batch.tokens[row[:, None], (safe + 1).clamp(max=T - 1)])
    return row, safe, valid, prev, label


def position_terms(
    logits: torch.Tensor,
    probs: torch.Tensor,
    p_row: torch.Tensor,
    label: torch.Tensor,
    vocab: Vocabulary,
    soft_ce: bool = True,
    mass: torch.Tensor | None = None,
    distance: Callable = soft_target_loss,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) cross-entropy and ‖q − p_t‖₁ at one block position (q from `logits`, p_t = probs[p_row]).
    With a draft vocabulary p_t's mass off its ids counts in full in the distance."""
    ce, tv, lse = distance(logits, probs, p_row)  # −Σ p_t log q, ‖q − p_t‖₁, log Σ exp
    if not soft_ce:
        in_vocab = label < vocab.n_out
        z_label = logits.gather(-1, label[:, None].clamp(max=vocab.n_out - 1)).squeeze(-1).float()
        ce = (lse - z_label) * in_vocab
    if vocab.size:
        mass = probs.sum(-1) if mass is None else mass
        tv = tv + (1 - mass[p_row]).clamp(min=0) * (p_row < probs.shape[0] - 1)
    return ce, tv


def block_losses(
    drafter: ParallelDrafter,
    target: Transformer,
    batch: FeatureBatch,
    anchors: torch.Tensor,
    valid_anchor: torch.Tensor,
    loss: BlockLoss | None = None,
    target_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
    speed: tuple[Callable, Callable] = (packed_backbone, soft_target_loss),
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """(total loss, mean c* per block position, the three terms) of the blocks at `anchors` (B, A) where
    `valid_anchor`; `speed`: the packed pass and the distance (a trainer may pass faster equals)."""
    gamma, tokens, device = drafter.config.gamma, batch.tokens, batch.tokens.device
    loss = loss or (BlockLoss() if drafter.has_confidence else DFLASH_LOSS)
    vocab = drafter.vocab  # with a draft vocabulary: q and p_t over its K ids
    if target_probs is None:
        target_probs = supervised_target_probs(target, batch, vocab.ids if vocab.size else None)
    probs, row_of = target_probs  # (N + 1, K or V)
    h, u_logits = packed_blocks(
        drafter, batch.taps, tokens, anchors, valid_anchor, batch.last_hidden, speed[0]
    )
    row, safe, valid, prev, label = block_slots(batch, anchors, valid_anchor, gamma, vocab)
    p_row = row_of[row[:, None], safe]  # (N, γ) row of p_t in `probs` (the zero row where not supervised)
    mass = probs.sum(-1) if vocab.size else None  # (N + 1,) p_t's mass on the draft ids

    # the head teacher-forced: x_{k-1} is the response's token, whatever the head would have drawn
    logits, confs = head_loop(
        drafter.sequential_logits, u_logits, h, prev[:, 0], lambda k, _: prev[:, min(k + 1, gamma - 1)]
    )
    flat = torch.stack(logits, 1).flatten(0, 1)  # (N·γ, V): every position at once
    ce, tv = position_terms(
        flat, probs, p_row.flatten(), label.flatten(), vocab, loss.soft_ce, mass, speed[1]
    )
    ce, tv = ce.view_as(p_row), tv.view_as(p_row)  # (N, γ)
    c_star = (1 - 0.5 * tv).detach().clamp(0, 1)  # (N, γ)
    m = valid.float()  # (N, γ) the slots whose next token exists
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
