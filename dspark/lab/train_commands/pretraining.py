"""`train data | target`: the offline corpus, the tokenizer and the token arrays; the tiny target pre-trained.

Each function parses nothing: it takes the parsed options (dspark/lab/commands/train.py builds them), calls the
library (dspark/lab/data/corpus.py, tokenizer.py; dspark/lab/training/target.py), prints what it made and, with --ship,
copies the compact result into dspark/assets/.

What this file does not do: build the corpus or train the model itself (the library does) or parse options
(dspark/lab/commands/train.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from dspark.checkpoint import ASSETS_DIR, TARGET_CHECKPOINT, TOKENIZER_PATH, load_target
from dspark.lab import storage
from dspark.lab.cli import UsageError
from dspark.lab.data.corpus import (
    CORPUS_MANIFEST_PATH,
    DOMAINS,
    EVAL_PROMPTS_PATH,
    build_samples,
    build_token_arrays,
    corpus_manifest,
    eval_prompts,
    write_jsonl,
)
from dspark.lab.storage import save_checkpoint
from dspark.lab.training.target import TrainConfig, train_target, train_tokenizer
from dspark.model import ModelConfig
from dspark.tokenizer import Tokenizer


def cmd_data(args: argparse.Namespace) -> None:
    """Build the three-domain corpus offline, (re)train the tokenizer, tokenise train/val splits and pick the
    held-out evaluation prompts.
    """
    out = Path(args.out)
    t0 = time.perf_counter()
    print("building samples (stdlib sources, docstrings, pydoc topics, math problems) ...")
    samples = build_samples(math_count=args.math_problems, seed=args.seed)
    manifest = corpus_manifest(samples, args.math_problems, args.seed)
    write_jsonl([s.__dict__ for s in samples], out / "corpus.jsonl")
    prompts = eval_prompts(samples)
    write_jsonl(prompts, out / "eval_prompts.jsonl")
    if args.retrain_tokenizer or not TOKENIZER_PATH.is_file():
        print(f"training a byte-level BPE tokenizer, vocabulary {args.vocab_size} ...")
        texts = (s.prompt + "\n" + s.response for s in samples if s.split == "train")
        tokenizer = train_tokenizer(texts, args.vocab_size)
        tokenizer.save(out / "tokenizer.json")
    else:
        print(f"using the shipped tokenizer {TOKENIZER_PATH} (--retrain-tokenizer to learn a new one)")
        shutil.copy(TOKENIZER_PATH, out / "tokenizer.json")
        tokenizer = Tokenizer.load(out / "tokenizer.json")
    print("tokenising ...")
    sizes = build_token_arrays(samples, tokenizer, out)
    manifest["tokens"] = sizes
    manifest["vocab_size"] = tokenizer.vocab_size
    storage.write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    print(f"\ncorpus sha256 {manifest['sha256'][:16]}…  (Python {manifest['python']})")
    print(
        f"{'domain':<6} {'train':>7} {'val':>6} {'eval':>5} {'chars':>11} {'train tokens':>13} {'val tokens':>11}"
    )
    for d in DOMAINS:
        m = manifest["domains"][d]
        n = m["samples"]
        print(
            f"{d:<6} {n['train']:>7} {n['val']:>6} {n['eval']:>5} {m['chars']:>11,} "
            f"{sizes[d + '.train']:>13,} {sizes[d + '.val']:>11,}"
        )
    if args.ship:
        shutil.copy(out / "tokenizer.json", TOKENIZER_PATH)
        shutil.copy(out / "eval_prompts.jsonl", EVAL_PROMPTS_PATH)
        shutil.copy(out / "manifest.json", CORPUS_MANIFEST_PATH)
        print(f"shipped tokenizer, manifest and {len(prompts)} evaluation prompts to {ASSETS_DIR}")
    print(f"done in {time.perf_counter() - t0:.0f}s; wrote {out}")


def cmd_target(args: argparse.Namespace) -> None:
    """Pre-train the target model on the corpus built by `data`. Checkpoints every --eval-every steps; --resume
    continues an interrupted run.
    """
    data = Path(args.data)
    manifest_path = data / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(f"no corpus in {data}; run `python -m dspark.train data` first")
    manifest = json.loads(manifest_path.read_text())
    run = Path(args.out)
    if args.resume and (run / "model.json").is_file():
        mc = ModelConfig.from_dict(json.loads((run / "model.json").read_text())["config"])
        print("resuming: model shape comes from the run's own model.json")
    else:
        mc = ModelConfig(vocab_size=manifest["vocab_size"], dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                         n_kv_heads=args.kv_heads, ffn_hidden=args.ffn_hidden, max_seq_len=args.context,
                         tap_layers=tuple(args.taps) if args.taps else ModelConfig.tap_layers)  # fmt: skip
    if args.seq_len > mc.max_seq_len:
        raise UsageError(f"--seq-len {args.seq_len} exceeds --context {mc.max_seq_len}")
    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                     warmup=args.warmup, eval_every=args.eval_every, checkpoint_every=args.eval_every,
                     seed=args.seed)  # fmt: skip
    if not args.resume and (run / "model.safetensors").exists():
        raise UsageError(f"{run} already holds a run; pass --resume to continue it or choose another --out")
    meta = train_target(mc, tc, data, run, resume=args.resume, corpus_hash=manifest["sha256"])
    print("validation loss / perplexity per domain:")
    for d in DOMAINS:
        print(f"  {d:<5} loss {meta['val_loss'][d]:.3f}  ppl {meta['val_ppl'][d]:.2f}")
    if args.ship:
        model, _ = load_target(run / "model.safetensors")
        save_checkpoint(model, mc, TARGET_CHECKPOINT, dtype=torch.float16, meta=meta)
        print(f"shipped fp16 weights to {TARGET_CHECKPOINT}")
