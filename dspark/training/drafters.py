"""Training the MTP-1 and EAGLE-3 style drafters on target-regenerated responses.

Per batch of sequences (prompt + the target's own response):
  1. one frozen target pass gives its tap features, final hidden states and,
     at temperature 1, the distribution p_t of every next token;
  2. step 0: every position i forms the entry (feature_i, token_{i+1}); one
     causal pass of the drafter predicts token_{i+2} from it;
  3. "training-time test" (EAGLE-3): steps k = 1..K-1 unroll the drafter on
     its OWN outputs, as at inference: the entry of chain i at step k pairs the
     drafter's previous output g^{k-1}_i with token_{i+k+1} and attends to the
     real entries 0..i plus its own chain's earlier steps (never to another
     chain). MTP-1 drafts one token, so K = 1.
The loss is the soft-label cross-entropy −Σ p_t log q at every step, weighted
0.8^k. Validation reports the expected acceptance c* = 1 − ½‖q − p_t‖₁ per
step (the exact acceptance rate of speculative sampling at T = 1); the fp16
checkpoint is rewritten at every validation, so an interrupted run leaves its
latest weights behind.

The optimizer loop (`train_drafter`) is shared with the DSpark/DFlash drafters,
whose three-term block loss lives in dspark/training/packed_blocks.py. What this
file does not do: regenerate responses (`dspark.training.responses`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dspark.checkpoint import save_checkpoint
from dspark.drafters.autoregressive import AutoregressiveDrafter
from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import ParallelDrafter
from dspark.model import Transformer
from dspark.training.packed_blocks import block_losses


@dataclass
class DrafterTrainConfig:
    steps: int = 600  # optimizer steps
    batch_size: int = 8  # sequences per step
    unroll: int = 7  # training-time-test steps K (MTP: 1)
    lr: float = 1e-3  # peak learning rate (AdamW, cosine decay)
    warmup: int = 30  # linear warm-up steps
    step_decay: float = 0.8  # loss weight of unrolled step k is step_decay**k
    eval_every: int = 100  # steps between validation passes
    eval_sequences: int = 48  # validation sequences
    anchors_per_seq: int = 16  # parallel drafters: packed blocks per training sequence
    seed: int = 0  # batch order and anchor positions


def pad_batch(records: list[dict], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) token ids (right-padded with 0) and (B,) lengths of prompt + response."""
    seqs = [(r["prompt_ids"] + r["response_ids"])[:max_len] for r in records]
    T = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
    return tokens, torch.tensor([len(s) for s in seqs])


def _layer_step(layer, x, positions, cache, rope_cos, rope_sin):
    """One pre-norm decoder layer for one unrolled step. x: (B, T, dim) entries of
    this step; `cache` holds the real (step 0) keys/values and this chain's
    earlier steps for this layer; the new keys/values are appended to it."""
    attn = layer.attn
    cos, sin = rope_cos[positions, None], rope_sin[positions, None]
    q, k, v = attn._qkv(layer.attn_norm(x), cos, sin)  # (B, T, H, hd), (B, T, Hkv, hd) x2
    rep = attn.n_heads // attn.n_kv_heads
    q = q.transpose(1, 2)  # (B, H, T, hd)
    k = k.transpose(1, 2).repeat_interleave(rep, 1)
    v = v.transpose(1, 2).repeat_interleave(rep, 1)
    scale = 1.0 / math.sqrt(attn.head_dim)
    T = x.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if not cache:  # step 0: real entries, plain causal attention
        cache.append((k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    else:
        real_k, real_v = cache[0]
        s_real = (q @ real_k.transpose(-1, -2)) * scale  # (B, H, T, T)
        s_real = s_real.masked_fill(~causal, float("-inf"))
        chain = [*cache[1:], (k, v)]  # this chain's steps 1..k, diagonal: chain i sees only chain i
        s_chain = torch.stack([(q * ck).sum(-1) * scale for ck, _ in chain], dim=-1)  # (B, H, T, k)
        weights = torch.softmax(torch.cat([s_real, s_chain], dim=-1), dim=-1)
        out = weights[..., :T] @ real_v
        out = out + sum(weights[..., T + j, None] * cv for j, (_, cv) in enumerate(chain))
        cache.append((k, v))
    x = x + attn.wo(out.transpose(1, 2).flatten(2))
    return x + layer.ffn(layer.ffn_norm(x))


def unrolled_log_probs(
    drafter: AutoregressiveDrafter,
    target: Transformer,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    unroll: int,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per unrolled step k: (log q (B, n, V) of token_{i+k+2} for every chain i,
    the target's distribution p_t of that token (B, n, V), validity mask (B, n)),
    with n = T - 1 chains, chain i starting from the real entry i."""
    B, T = tokens.shape
    with torch.no_grad():
        out = target(tokens, return_taps=True)
        p_target = torch.softmax(out.logits.float(), dim=-1)  # (B, T, V): distribution of token t+1
    feats = TargetFeatures(out.taps.flatten(0, 1), out.last_hidden.flatten(0, 1))
    g = drafter.features_of(feats).view(B, T, -1)[:, :-1]  # feature at i, i = 0..T-2
    idx = torch.arange(T - 1)
    caches = [[] for _ in drafter.layers]
    steps = []
    for k in range(min(unroll, T - 1)):
        token_pos = (idx + k + 1).clamp(max=T - 1)  # token_{i+k+1} enters chain i at step k
        valid = (idx + k + 1)[None, :] < lengths[:, None]  # (B, n) that token exists
        x = drafter.entries(tokens[:, token_pos], g)
        for layer, cache in zip(drafter.layers, caches):
            x = _layer_step(layer, x, idx + k, cache, drafter.rope_cos, drafter.rope_sin)
        g = x  # fed back as the next step's feature
        log_q = torch.log_softmax(drafter.logits(x).float(), dim=-1)
        steps.append((log_q, p_target[:, token_pos], valid))
    return steps


def unrolled_losses(
    drafter: AutoregressiveDrafter,
    target: Transformer,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    unroll: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per unrolled step: (soft cross-entropy −Σ p_t log q, mean expected acceptance c*)."""
    losses, accept = [], []
    for log_q, p, valid in unrolled_log_probs(drafter, target, tokens, lengths, unroll):
        losses.append(-(p * log_q).sum(-1)[valid].mean())
        with torch.no_grad():
            accept.append((1 - 0.5 * (log_q.exp() - p).abs().sum(-1))[valid].mean())
    return losses, accept


def batch_loss(
    drafter, target, tokens, lengths, tc: DrafterTrainConfig, generator
) -> tuple[torch.Tensor, list]:
    """(loss, expected acceptance per draft position) for any trainable drafter."""
    if isinstance(drafter, ParallelDrafter):
        loss, acc, _ = block_losses(drafter, target, tokens, lengths, tc.anchors_per_seq, generator)
        return loss, acc
    unroll = tc.unroll if drafter.config.kind == "eagle" else 1
    losses, acc = unrolled_losses(drafter, target, tokens, lengths, unroll)
    weights = [tc.step_decay**k for k in range(len(losses))]
    return sum(w * item for w, item in zip(weights, losses)) / sum(weights), acc


def train_drafter(
    drafter: AutoregressiveDrafter | ParallelDrafter,
    target: Transformer,
    train: list[dict],
    val: list[dict],
    tc: DrafterTrainConfig,
    out_path: Path,
    meta: dict,
) -> dict:
    """Train `drafter` (the target stays frozen) and save it to `out_path` (fp16)."""
    for p in target.parameters():
        p.requires_grad_(False)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(tc.seed)
    max_len = target.config.max_seq_len
    history = []

    def evaluate() -> list[float]:
        drafter.eval()
        eval_gen = torch.Generator().manual_seed(1234)  # the same anchors at every validation
        rows = []
        with torch.no_grad():
            for i in range(0, min(len(val), tc.eval_sequences), tc.batch_size):
                _, acc = batch_loss(
                    drafter, target, *pad_batch(val[i : i + tc.batch_size], max_len), tc, eval_gen
                )
                rows.append(torch.stack(acc))
        drafter.train()
        width = max(len(r) for r in rows)
        table = torch.full((len(rows), width), float("nan"))
        for j, r in enumerate(rows):
            table[j, : len(r)] = r
        return table.nanmean(0).tolist()

    drafter.train()
    bar = tqdm(range(tc.steps), desc=f"drafter {drafter.config.kind}", unit="step")
    t0 = time.perf_counter()
    for step in bar:
        lr = tc.lr * min(1.0, (step + 1) / tc.warmup) * 0.5 * (1 + math.cos(math.pi * step / tc.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        pick = torch.randint(0, len(train), (tc.batch_size,), generator=g).tolist()
        loss, acc = batch_loss(drafter, target, *pad_batch([train[i] for i in pick], max_len), tc, g)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", c1=f"{acc[0].item():.3f}")
        if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
            val_acc = evaluate()
            history.append({"step": step + 1, "val_expected_acceptance": val_acc})
            bar.write(
                f"step {step + 1}: expected acceptance per step " + " ".join(f"{a:.3f}" for a in val_acc)
            )
            record = {
                **meta,
                "train_config": asdict(tc),
                "val_expected_acceptance": val_acc,
                "history": history,
                "seconds": time.perf_counter() - t0,
            }
            save_checkpoint(drafter, drafter.config, out_path, dtype=torch.float16, meta=record)
    return record


def load_history(path: Path) -> dict:
    return json.loads(Path(path).with_suffix(".json").read_text())["meta"]
