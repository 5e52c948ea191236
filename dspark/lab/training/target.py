"""Pre-training the target model on the three-domain corpus.

Next-token prediction on random windows cut from each domain's token stream
(samples are stored back to back, each `<|bos|> ... <|eos|>`), with batches
mixing the domains by fixed weights. AdamW, linear warm-up then cosine decay,
gradient clipping. Every `eval_every` steps the validation loss is measured
per domain on fixed windows; every `checkpoint_every` steps the run directory
gets the weights, optimizer state and a log line, so an interrupted run
resumes where it stopped (`--resume`).

What this file does not do: build data (`dspark.lab.data.corpus`) or drafters.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from dspark.checkpoint import read_checkpoint
from dspark.lab.data.corpus import DOMAINS, load_token_array
from dspark.lab.storage import save_checkpoint
from dspark.model import ModelConfig, Transformer
from dspark.tokenizer import SPECIAL_TOKENS, Tokenizer


@dataclass
class TrainConfig:
    steps: int = 2600  # optimizer steps in total
    batch_size: int = 8  # windows per step
    seq_len: int = 512  # tokens per window (<= model context)
    lr: float = 1.5e-3  # peak learning rate
    min_lr: float = 1e-4  # learning rate at the end of the cosine
    warmup: int = 100  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    grad_clip: float = 1.0  # max global gradient norm
    eval_every: int = 200  # steps between validation passes
    eval_windows: int = 32  # validation windows per domain
    checkpoint_every: int = 200  # steps between checkpoints
    seed: int = 0  # seeds init and the batch sampler
    # Fraction of each batch drawn from each domain.
    domain_weights: dict[str, float] = field(default_factory=lambda: {"code": 0.4, "math": 0.3, "chat": 0.3})


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    progress = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1 + math.cos(math.pi * progress))


class WindowSampler:
    """Random (seq_len + 1)-token windows from per-domain token arrays."""

    def __init__(self, arrays: dict[str, np.ndarray], seq_len: int, seed: int) -> None:
        self.arrays, self.seq_len = arrays, seq_len
        self.rng = np.random.default_rng(seed)
        for name, arr in arrays.items():
            if len(arr) <= seq_len + 1:
                raise ValueError(f"domain {name} has only {len(arr)} tokens")

    def batch(self, counts: dict[str, int]) -> torch.Tensor:
        rows = []
        for name, n in counts.items():
            arr = self.arrays[name]
            for start in self.rng.integers(0, len(arr) - self.seq_len - 1, size=n):
                rows.append(arr[start : start + self.seq_len + 1].astype(np.int64))
        return torch.from_numpy(np.stack(rows))  # (B, seq_len + 1)


def domain_counts(tc: TrainConfig) -> dict[str, int]:
    """Split batch_size rows between domains by weight (largest remainder)."""
    total = sum(tc.domain_weights.values())
    raw = {d: tc.batch_size * w / total for d, w in tc.domain_weights.items()}
    counts = {d: int(r) for d, r in raw.items()}
    for d in sorted(raw, key=lambda d: raw[d] - counts[d], reverse=True):
        if sum(counts.values()) == tc.batch_size:
            break
        counts[d] += 1
    return counts


@torch.no_grad()
def validation_loss(model: Transformer, val: dict[str, np.ndarray], tc: TrainConfig) -> dict:
    """Mean next-token loss per domain on fixed (seeded) validation windows."""
    model.eval()
    out = {}
    for domain, arr in val.items():
        sampler = WindowSampler({domain: arr}, tc.seq_len, seed=1234)
        windows = sampler.batch({domain: tc.eval_windows})
        losses = []
        for chunk in windows.split(16):
            logits = model(chunk[:, :-1]).logits
            losses.append(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
        out[domain] = float(sum(losses) / windows[:, 1:].numel())
    model.train()
    return out


def make_optimizer(model: Transformer, tc: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(0.9, 0.95), eps=1e-8)


def train_target(
    model_config: ModelConfig,
    tc: TrainConfig,
    data_dir: Path,
    run_dir: Path,
    resume: bool = False,
    corpus_hash: str = "",
) -> dict:
    """Train (or resume) and return the final metadata; weights land in run_dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    train = {d: load_token_array(data_dir, d, "train") for d in DOMAINS}
    val = {d: load_token_array(data_dir, d, "val") for d in DOMAINS}
    torch.manual_seed(tc.seed)
    model = Transformer(model_config)
    optimizer = make_optimizer(model, tc)
    sampler = WindowSampler(train, tc.seq_len, tc.seed)
    state = {"step": 0, "tokens": 0, "seconds": 0.0}
    weights = run_dir / "model.safetensors"
    if resume and weights.is_file():
        _, tensors = read_checkpoint(weights)
        model.load_state_dict(tensors, strict=False)
        extra = torch.load(run_dir / "trainer.pt", weights_only=False)
        optimizer.load_state_dict(extra["optimizer"])
        sampler.rng.bit_generator.state = extra["sampler_rng"]
        state = extra["state"]
        print(f"resuming from step {state['step']}")
    counts = domain_counts(tc)
    log = open(run_dir / "log.jsonl", "a")
    meta: dict = {}

    def checkpoint(val_loss: dict) -> dict:
        meta = {
            **state,
            "val_loss": val_loss,
            "val_ppl": {d: math.exp(v) for d, v in val_loss.items()},
            "train_config": asdict(tc),
            "corpus_sha256": corpus_hash,
            "parameters": model.num_parameters(),
        }
        save_checkpoint(model, model_config, weights, meta=meta)
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "sampler_rng": sampler.rng.bit_generator.state,
                "state": state,
            },
            run_dir / "trainer.pt",
        )
        return meta

    model.train()
    bar = tqdm(total=tc.steps, initial=state["step"], desc="target", unit="step")
    while state["step"] < tc.steps:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state["step"], tc)
        batch = sampler.batch(counts)
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        state["step"] += 1
        state["tokens"] += batch[:, 1:].numel()
        state["seconds"] += time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{state['tokens'] / state['seconds']:.0f}")
        step = state["step"]
        record = {"step": step, "loss": loss.item(), "lr": lr_at(step - 1, tc)}
        if step % tc.eval_every == 0 or step == tc.steps:
            record["val_loss"] = validation_loss(model, val, tc)
            bar.write(
                f"step {step}: val loss " + ", ".join(f"{d} {v:.3f}" for d, v in record["val_loss"].items())
            )
        if step % tc.checkpoint_every == 0 or step == tc.steps:
            meta = checkpoint(record.get("val_loss") or validation_loss(model, val, tc))
        log.write(json.dumps(record) + "\n")
        log.flush()
    bar.close()
    log.close()
    if not meta:  # resumed a finished run
        meta = checkpoint(validation_loss(model, val, tc))
    return meta


DEFAULT_VOCAB_SIZE = 4096


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE vocabulary learnt on `texts` (an iterator is fine) with the `tokenizers` library (Rust:
    BPE training in Python would take minutes on the corpus); the special tokens get ids 0..5."""
    if not 256 + len(SPECIAL_TOKENS) < vocab_size <= 65535:
        raise ValueError(f"vocab_size must be in ({256 + len(SPECIAL_TOKENS)}, 65535]")
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(backend)
