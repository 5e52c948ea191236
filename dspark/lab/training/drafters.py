"""Training every drafter on the target's own responses, from its cached features.

Per batch of sequences (prompt + the target's own response) the frozen target's
features come from the feature cache (feature_cache.py: computed once; a live
target pass gives the same numbers), and its distribution p_t only where a
drafter is supervised. Supervision is the same for every drafter
(anchors.py): an anchor is a response token with a response token after it.

  * MTP-1 / EAGLE-3: every position i forms the entry (feature_i, token_{i+1});
    one causal pass of the drafter predicts token_{i+2} from it; chain i is
    supervised when its anchor token_{i+1} is an anchor. "Training-time test"
    (EAGLE-3): steps k = 1..K-1 unroll the drafter on its OWN outputs, as at
    inference: the entry of chain i at step k pairs the drafter's previous
    output g^{k-1}_i with token_{i+k+1} and attends to the real entries 0..i
    plus its own chain's earlier steps (never to another chain). MTP-1 drafts
    one token, so K = 1. Loss: soft-label cross-entropy −Σ p_t log q, step
    weights 0.8^k.
  * DFlash / DSpark: packed blocks at sampled anchors (dspark/training.py, with fast_loss.py's speed paths).

The budget is counted in epochs over supervised positions: one epoch = every
anchor of the training set used once (MTP-1 and EAGLE-3 use all anchors of a
sequence per pass, the parallel drafters `anchors_per_seq` of them), so
drafters compared at the same `epochs` saw the same data equally often.
Validation reports the expected acceptance c* = 1 − ½‖q − p_t‖₁ per draft
position (the exact acceptance rate of speculative sampling at T = 1) on the
validation responses, with the same anchor sampler; the fp16 checkpoint is
rewritten at every validation, so an interrupted run leaves its latest weights,
and the trainer's state beside it lets `resume=True` continue the run exactly.

What this file does not do: regenerate responses (`dspark.lab.training.responses`)
or build the feature cache.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dspark.device import model_device
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab.draft_vocab import build_drafter, draft_vocabulary
from dspark.lab.storage import save_checkpoint
from dspark.lab.training.anchors import anchor_counts, candidate_counts, every_anchor, sample_anchors
from dspark.lab.training.fast_loss import block_losses, draft_target_probs, soft_target_loss
from dspark.model import Transformer
from dspark.training import DFLASH_LOSS, BlockLoss, FeatureBatch, supervised_target_probs


@dataclass
class DrafterTrainConfig:
    epochs: float = 0.5  # passes over the supervised positions (every response anchor once per epoch)
    steps: int = 0  # optimizer steps; 0 = as many as `epochs` takes
    batch_size: int = 8  # sequences per step
    unroll: int = 7  # training-time-test steps K (MTP: 1)
    lr: float = 1e-3  # peak learning rate (AdamW, cosine decay to 0)
    warmup: float = 0.04  # linear warm-up, as a fraction of the steps
    step_decay: float = 0.8  # EAGLE: loss weight of unrolled step k is step_decay**k
    eval_every: int = 1000  # steps between validation passes
    eval_sequences: int = 0  # validation sequences (0 = all)
    anchors_per_seq: int = 16  # parallel drafters: anchors per sequence and pass, 0 = all
    position_decay: float = 4.0  # parallel drafters: position weight exp(-(k-1)/decay)
    ce_weight: float = 0.9  # DSpark: CE weight; TV gets 1 - it, confidence 1 (paper: 0.1)
    soft_ce: bool = True  # DSpark: cross-entropy against p_t instead of the sampled token (paper: the token)
    bf16: bool = True  # drafter forward under bf16 autocast (losses in fp32)
    seed: int = 0  # sequence order and anchor positions

    def block_loss(self, drafter: ParallelDrafter) -> BlockLoss:
        if not drafter.has_confidence:  # DFlash: its own recipe, cross-entropy against the token only
            return replace(DFLASH_LOSS, decay=self.position_decay)
        return BlockLoss(self.ce_weight, 1 - self.ce_weight, 1.0, self.soft_ce, self.position_decay)


class FeatureSource(Protocol):
    """Where training reads sequences and the target's features: a FeatureCache or LiveFeatures."""

    def __len__(self) -> int: ...
    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def batch(self, indices: list[int]) -> FeatureBatch: ...


def _layer_step(layer, x, positions, cache, rope_cos, rope_sin):
    """One pre-norm decoder layer for one unrolled step. x: (B, T, dim) entries of
    this step ((B, T, 3·dim) for the EAGLE-3 layer: its `attention_input` and `residual`); `cache` holds the real (step 0) keys/values and this chain's
    earlier steps for this layer; the new keys/values are appended to it."""
    attn = layer.attn
    cos, sin = rope_cos[positions, None], rope_sin[positions, None]
    q, k, v = attn._qkv(layer.attention_input(x), cos, sin)  # (B, T, H, hd), (B, T, Hkv, hd) x2
    rep = attn.n_heads // attn.n_kv_heads
    q = q.transpose(1, 2)  # (B, H, T, hd)
    k = k.transpose(1, 2).repeat_interleave(rep, 1)
    v = v.transpose(1, 2).repeat_interleave(rep, 1)
    scale = 1.0 / math.sqrt(attn.head_dim)
    T = x.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    if not cache:  # step 0: real entries, plain causal attention
        cache.append((k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
    else:
        real_k, real_v = cache[0]
        s_real = (q @ real_k.transpose(-1, -2)) * scale  # (B, H, T, T)
        s_real = s_real.masked_fill(~causal, float("-inf"))
        chain = [*cache[1:], (k, v)]  # this chain's steps 1..k, diagonal: chain i sees only chain i
        s_chain = torch.stack([(q * ck).sum(-1) * scale for ck, _ in chain], dim=-1)  # (B, H, T, k)
        weights = torch.softmax(torch.cat([s_real, s_chain], dim=-1), dim=-1).to(real_v.dtype)
        out = weights[..., :T] @ real_v
        out = out + sum(weights[..., T + j, None] * cv for j, (_, cv) in enumerate(chain))
        cache.append((k, v))
    x = layer.residual(x) + attn.wo(out.transpose(1, 2).flatten(2))
    return x + layer.ffn(layer.ffn_norm(x))


def unrolled_logits(
    drafter: AutoregressiveDrafter,
    target: Transformer,
    batch: FeatureBatch,
    unroll: int,
    target_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """(p_t table (N + 1, V), per unrolled step k: (logits (n, V) of token_{i+k+2}, the row of its p_t in the
    table (n,), the supervised chains (B, T-1))) -- with a draft vocabulary (n, K) and p_t at its ids only.
    Chain i starts from the real entry i; it is supervised at step k when token_{i+1} is an anchor (a response
    token) and token_{i+k+2} exists; the n rows are the supervised chains in row-major order."""
    B, T = batch.tokens.shape
    if target_probs is None:
        vocab = draft_vocabulary(drafter)  # p_t at the draft vocabulary's ids only
        target_probs = (
            draft_target_probs(target, batch, vocab.ids) if vocab else supervised_target_probs(target, batch)
        )
    probs, row_of = target_probs
    tokens = batch.tokens
    lengths, prompt_lens = batch.lengths.to(tokens.device), batch.prompt_lens.to(tokens.device)
    g = drafter.features_of(batch.flat_features()).view(B, T, -1)[:, :-1]  # feature at i, i = 0..T-2
    idx = torch.arange(T - 1, device=tokens.device)
    is_anchor = (idx + 1)[None, :] >= prompt_lens[:, None]  # (B, T-1) token_{i+1} is a response token
    caches = [[] for _ in drafter.layers]
    steps = []
    for k in range(min(unroll, T - 1)):
        token_pos = (idx + k + 1).clamp(max=T - 1)  # token_{i+k+1} enters chain i at step k
        valid = is_anchor & ((idx + k + 2)[None, :] < lengths[:, None])  # (B, T-1)
        x = drafter.entries(tokens[:, token_pos], g)
        for layer, cache in zip(drafter.layers, caches):
            x = _layer_step(layer, x, idx + k, cache, drafter.rope_cos, drafter.rope_sin)
        g = x  # fed back as the next step's feature
        steps.append((drafter.logits(x[valid]), row_of[:, token_pos][valid], valid))  # supervised chains only
    return probs, steps


def unrolled_log_probs(
    drafter: AutoregressiveDrafter,
    target: Transformer,
    batch: FeatureBatch,
    unroll: int,
    target_probs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """`unrolled_logits` as (log q (n, V), the target's p_t (n, V), the supervised chains (B, T-1)) per step."""
    probs, steps = unrolled_logits(drafter, target, batch, unroll, target_probs)
    return [(torch.log_softmax(z.float(), dim=-1), probs[rows], valid) for z, rows, valid in steps]


def unrolled_losses(
    drafter: AutoregressiveDrafter, target: Transformer, batch: FeatureBatch, unroll: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per unrolled step: (soft cross-entropy −Σ p_t log q, mean expected acceptance c*)."""
    losses, accept = [], []
    probs, steps = unrolled_logits(drafter, target, batch, unroll)
    mass = probs.sum(-1) if draft_vocabulary(drafter) else None  # (N + 1,) p_t's mass on the draft ids
    for logits, rows, _ in steps:
        if logits.shape[0] == 0:
            break
        ce, l1, _ = soft_target_loss(logits, probs, rows)  # fast_loss.py: gradient by hand
        losses.append(ce.mean())
        with (
            torch.no_grad()
        ):  # c* = 1 - ½‖q − p_t‖₁ over the whole vocabulary (p_t's mass off the draft ids too)
            tv = l1 + (1 - mass[rows]).clamp(min=0) if mass is not None else l1
            accept.append((1 - 0.5 * tv).mean())
    return losses, accept


def batch_loss(
    drafter, target: Transformer, batch: FeatureBatch, tc: DrafterTrainConfig, generator: torch.Generator
) -> tuple[torch.Tensor | None, list[torch.Tensor], int, int]:
    """(loss, expected acceptance per draft position, anchors, supervised (anchor, position) pairs)
    for any trainable drafter; the loss is None when the batch has nothing to supervise."""
    K = unroll_steps(drafter, tc)
    device = batch.tokens.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=tc.bf16):
        if isinstance(
            drafter, ParallelDrafter
        ):  # anchors drawn on the host (lengths live there), used on device
            anchors, valid = sample_anchors(batch.lengths, batch.prompt_lens, tc.anchors_per_seq, generator)
            loss, acc, _ = block_losses(
                drafter, target, batch, anchors.to(device), valid.to(device), tc.block_loss(drafter)
            )
        else:
            losses, acc = unrolled_losses(drafter, target, batch, K)
            weights = [tc.step_decay**k for k in range(len(losses))]
            loss = sum(w * item for w, item in zip(weights, losses)) / sum(weights) if losses else None
            anchors, valid = every_anchor(batch.lengths, batch.prompt_lens)  # every chain is supervised
    ahead = (batch.lengths[:, None] - 1 - anchors).clamp(min=0, max=K)  # tokens after each anchor, up to K
    return loss, acc, int(valid.sum()), int(ahead[valid].sum())


def unroll_steps(drafter, tc: DrafterTrainConfig) -> int:
    """Draft positions a drafter is trained (and validated) on: γ, EAGLE's unroll, or 1 for MTP-1."""
    if isinstance(drafter, ParallelDrafter):
        return drafter.config.gamma
    return tc.unroll if drafter.config.kind == "eagle" else 1


def planned_steps(drafter, source: FeatureSource, tc: DrafterTrainConfig) -> int:
    """Optimizer steps for `tc.epochs` epochs over the supervised positions of `source`."""
    if tc.steps:
        return tc.steps
    lengths, prompt_lens = source.lengths()
    density = tc.anchors_per_seq if isinstance(drafter, ParallelDrafter) else 0
    per_pass = float(anchor_counts(lengths, prompt_lens, density).sum())  # anchors one pass uses
    passes = tc.epochs * float(candidate_counts(lengths, prompt_lens).sum()) / max(per_pass, 1.0)
    return max(1, math.ceil(passes * len(source) / tc.batch_size))


def length_bucketed_batches(
    lengths: torch.Tensor, batch_size: int, generator: torch.Generator, pool: int = 32
):
    """Batches of sequence indices, forever: each pass over the data is shuffled, cut into pools of
    `pool` batches, each pool sorted by length and cut into batches, and the pass's batches shuffled.
    Every sequence appears once per pass; a batch holds sequences of similar length, so little of a
    step is padding (packed blocks pad every row to the batch's longest response)."""
    n = len(lengths)
    while True:
        perm = torch.randperm(n, generator=generator, device=generator.device)
        batches = []
        for start in range(0, n, batch_size * pool):
            chunk = perm[start : start + batch_size * pool]
            chunk = chunk[lengths[chunk].argsort(stable=True)]
            batches += [chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
        for i in torch.randperm(len(batches), generator=generator, device=generator.device).tolist():
            yield batches[i]


def evaluate(drafter, target: Transformer, val: FeatureSource, tc: DrafterTrainConfig) -> list[float]:
    """Mean c* per draft position over the validation sequences (the same anchors every time)."""
    was_training = drafter.training
    drafter.eval()
    eval_gen = torch.Generator().manual_seed(1234)
    n = len(val) if tc.eval_sequences == 0 else min(len(val), tc.eval_sequences)
    width = unroll_steps(drafter, tc)
    sums = torch.zeros(width, dtype=torch.float64, device="cpu")  # host-side bookkeeping
    counts = torch.zeros(width, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        for i in range(0, n, tc.batch_size):
            batch = val.batch(list(range(i, min(n, i + tc.batch_size)))).to(model_device(drafter))
            _, acc, anchors, _ = batch_loss(drafter, target, batch, tc, eval_gen)
            row = torch.tensor([float(a) for a in acc][:width], dtype=torch.float64, device="cpu")
            seen = torch.zeros(width, dtype=torch.bool, device="cpu")
            seen[: len(row)] = ~row.isnan()
            sums[seen] += row[seen[: len(row)]] * anchors  # weighted by the batch's anchors
            counts[seen] += anchors
    drafter.train(was_training)
    return (sums / counts.clamp(min=1)).tolist()


def learning_rate(step: int, steps: int, peak: float, warmup: float) -> float:
    """The reference trainer's schedule at optimizer step `step` (0-based) of `steps`: a linear warm-up over the
    first `warmup` fraction of the steps up to `peak`, then cosine decay towards 0 over the rest."""
    warm = max(1, round(warmup * steps))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm + 1) / (steps - warm + 1)
    return peak * 0.5 * (1 + math.cos(math.pi * progress))


def trainer_state_path(out_path: Path) -> Path:
    """Where `train_drafter` keeps what a resumed run needs (fp32 weights, optimizer, generators, progress)
    next to the fp16 checkpoint `out_path`; removed when the run finishes."""
    return Path(out_path).with_suffix(".trainer.pt")


def snapshot_path(out_path: Path, epochs: float) -> Path:
    """Where `train_drafter(keep_at=...)` keeps the drafter after `epochs`: run.safetensors -> run.epochs-2.safetensors."""
    return Path(out_path).with_name(f"{Path(out_path).stem}.epochs-{epochs:g}.safetensors")


def train_drafter(
    drafter: AutoregressiveDrafter | ParallelDrafter,
    target: Transformer,
    train: FeatureSource,
    val: FeatureSource,
    tc: DrafterTrainConfig,
    out_path: Path,
    meta: dict,
    resume: bool = False,
    keep_at: tuple[float, ...] = (),
) -> dict:
    """Train `drafter` (the target stays frozen) and save it to `out_path` (fp16) at every validation, with the
    trainer's state next to it (`trainer_state_path`): `resume=True` continues from that state, exactly as if
    the run had not stopped (the same batches, anchors and weights), when `tc` and the data are the same.
    `keep_at`: epochs at which a validated copy is also kept (`snapshot_path`), at the first step reaching
    each — one run gives a budget curve (the learning rate there is that of this run's schedule, not of a run
    that ends there). Not part of what a resumed run must share."""
    for p in target.parameters():
        p.requires_grad_(False)
    device = model_device(drafter)  # the target's too: batches move there, the anchors are drawn on the host
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=(0.9, 0.95), weight_decay=0.0)
    order_gen = torch.Generator().manual_seed(tc.seed)  # the sequence order ...
    g = torch.Generator().manual_seed(tc.seed + 1)  # ... and the anchors draw from separate generators
    lengths, prompt_lens = train.lengths()
    order = length_bucketed_batches(lengths - prompt_lens, tc.batch_size, order_gen)  # by response length
    steps = planned_steps(drafter, train, tc)
    total_anchors = float(candidate_counts(lengths, prompt_lens).sum())
    identity = {"train_config": asdict(tc), "steps": steps, "sequences": len(train), "anchors": total_anchors,
                "drafter": asdict(drafter.config)}  # what a resumed run must share  # fmt: skip
    state = {"step": 0, "seen": 0, "busy": 0.0, "seconds": 0.0, "history": []}
    trainer_path = trainer_state_path(out_path)
    if resume:
        state = resume_state(trainer_path, identity, drafter, optimizer, g)
        for _ in range(state["step"]):  # replay the order (index lists only) up to where the run stopped
            next(order)
    drafter.train()
    bar = tqdm(range(state["step"], steps), desc=f"drafter {drafter.config.kind}", unit="step",
               initial=state["step"], total=steps)  # fmt: skip
    t0 = time.perf_counter() - state["seconds"]
    record = {}
    for step in bar:
        t_step = time.perf_counter()
        lr = learning_rate(step, steps, tc.lr, tc.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = train.batch(next(order)).to(device)
        loss, acc, anchors, _ = batch_loss(drafter, target, batch, tc, g)
        state["seen"] += anchors
        epochs = state["seen"] / total_anchors
        if loss is not None:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", c1=f"{float(acc[0]):.3f}", epochs=f"{epochs:.2f}")
        state["busy"] += time.perf_counter() - t_step
        regular = (step + 1) % tc.eval_every == 0 or step + 1 == steps  # a validation that saves the run
        reached = [e for e in keep_at if epochs >= e > (state["seen"] - anchors) / total_anchors]
        if regular or reached:
            val_acc = evaluate(drafter, target, val, tc)
            state["history"].append({"step": step + 1, "epochs": epochs, "val_expected_acceptance": val_acc})
            bar.write(f"step {step + 1} ({epochs:.2f} epochs): expected acceptance per position "
                      + " ".join(f"{a:.3f}" for a in val_acc))  # fmt: skip
            state["step"], state["seconds"] = step + 1, time.perf_counter() - t0
            record = {**meta, "train_config": asdict(tc), "steps": steps, "epochs": epochs,
                      "anchors_seen": state["seen"], "anchors_per_s": state["seen"] / state["busy"],
                      "val_expected_acceptance": val_acc, "history": state["history"], "seconds": state["seconds"]}  # fmt: skip
            for e in reached:  # a snapshot does not move the resume point: the state is saved as usual
                save_checkpoint(drafter, drafter.config, snapshot_path(out_path, e), dtype=torch.float16,
                                meta=record)  # fmt: skip
            if regular:
                save_checkpoint(drafter, drafter.config, out_path, dtype=torch.float16, meta=record)
                save_trainer_state(trainer_path, identity, state, drafter, optimizer, g)
    if not record:  # resumed a run that had already finished
        raise ValueError(f"{trainer_path} holds a finished run; its weights are in {out_path}")
    trainer_path.unlink(missing_ok=True)  # finished: the fp16 checkpoint is the result
    return record


def save_trainer_state(
    path: Path, identity: dict, state: dict, drafter, optimizer, g: torch.Generator
) -> None:
    """Write the trainer's state atomically (a run killed while writing keeps the previous one)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"identity": identity, "state": state, "drafter": drafter.state_dict(),
                "optimizer": optimizer.state_dict(), "anchor_rng": g.get_state()}, tmp)  # fmt: skip
    tmp.replace(path)


def resume_state(path: Path, identity: dict, drafter, optimizer, g: torch.Generator) -> dict:
    """Load a run's saved state into `drafter`, `optimizer` and `g`; refuse one from other settings or data."""
    if not path.is_file():
        raise ValueError(
            f"nothing to resume: {path} does not exist (a run writes it at its first validation)"
        )
    saved = torch.load(path, weights_only=False)
    if saved["identity"] != identity:
        flat = [{**i["train_config"], **i["drafter"], **{k: v for k, v in i.items() if not isinstance(v, dict)}}
                for i in (saved["identity"], identity)]  # fmt: skip
        diff = [k for k in flat[1] if flat[0].get(k) != flat[1][k]]
        raise ValueError(f"{path} was written by a run with other settings or data (differs in: "
                         f"{', '.join(diff)}); rerun with those or start afresh without --resume")  # fmt: skip
    drafter.load_state_dict(saved["drafter"])
    optimizer.load_state_dict(saved["optimizer"])
    g.set_state(saved["anchor_rng"])
    return saved["state"]


def load_history(path: Path) -> dict:
    return json.loads(Path(path).with_suffix(".json").read_text())["meta"]


def new_drafter(
    target: Transformer,
    kind: str,
    gamma: int = 7,
    layers: int = 0,
    rank: int | None = None,
    draft_vocab: int = 0,
    ffn_hidden: int = 0,
    qk_norm: bool = False,
    eagle3_layer: bool = False,
) -> Drafter:
    """A freshly initialised drafter of `kind` for `target` (its SwiGLU width); MTP-1 always drafts 1 token,
    `layers` 0 = the kind's default depth, `rank` None = the default sequential-head rank, `draft_vocab` K > 0:
    it scores K target ids (the first K until `drafter.vocab.set_ids` chooses them), 0 = all; `ffn_hidden`: the
    SwiGLU width of its layers (0 = the target's); `qk_norm`: the parallel kinds' layers norm q and k per head (Qwen3's, what the
    serving engines load); `eagle3_layer`: EAGLE's one layer is EAGLE-3's own (drafters/autoregressive.py, Eagle3Layer)."""
    ffn_hidden = ffn_hidden or target.config.ffn_hidden
    if kind in PARALLEL_KINDS:
        config = ParallelDrafterConfig(kind, gamma, layers or ParallelDrafterConfig.n_layers, ffn_hidden,
                                       rank=ParallelDrafterConfig.rank if rank is None else rank,
                                       mask_id=min(ParallelDrafterConfig.mask_id, target.config.vocab_size - 1),
                                       draft_vocab=draft_vocab, qk_norm=qk_norm)  # fmt: skip
        return build_drafter(target, config)
    layers = layers or AutoregressiveDrafterConfig.n_layers
    config = AutoregressiveDrafterConfig(
        kind,
        1 if kind == "mtp" else gamma,
        layers,
        ffn_hidden,
        draft_vocab=draft_vocab,
        eagle3_layer=eagle3_layer and kind == "eagle",
    )
    return build_drafter(target, config)
