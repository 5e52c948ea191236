"""`train drafter`: a drafter (mtp | eagle | dflash | dspark | dspark-rnn) trained on the target's responses.

`cmd_drafter` refuses option combinations that do not fit the kind, loads the frozen target and the
feature caches (dspark/lab/train_commands/drafter_data.py), builds the drafter (dspark/drafters/__init__.py),
trains it (dspark/lab/training/drafters.py) and writes the checkpoint under DSPARK_HOME, to --out, or with
--ship into dspark/assets/. `training_in_bf16` decides --bf16 when it is not given.

What this file does not do: the training loop or the losses (dspark/lab/training/drafters.py,
dspark/training.py), or calibrate the confidence head (dspark/lab/train_commands/calibrate.py).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from dspark.device import model_device
from dspark.drafters import default_path
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.lab import storage
from dspark.lab.cli import UsageError
from dspark.lab.cpu_speed import fast_on_cpu
from dspark.lab.draft_vocab import most_frequent
from dspark.lab.machine import cpu_has_bf16
from dspark.lab.train_commands.drafter_data import feature_caches, load_training_target
from dspark.lab.training.drafters import DrafterTrainConfig, new_drafter


def training_in_bf16(choice: bool | None, device: torch.device | None = None) -> bool:
    """--bf16 / --no-bf16 as given; unset: bf16 autocast on a GPU, and on a CPU only where it has BF16
    instructions (without them torch emulates bf16 and a step is many times slower than in fp32)."""
    if choice is not None:
        return choice
    if device is not None and device.type != "cpu":
        return True
    native = cpu_has_bf16()
    reason = (
        "this CPU has BF16 instructions" if native else "this CPU has no BF16 instructions (emulated: slower)"
    )
    print(f"drafter forward in {'bf16 autocast' if native else 'fp32'}: {reason}; --bf16/--no-bf16 choose")
    return native


def cmd_drafter(args: argparse.Namespace) -> None:
    """Train a drafter on the target-regenerated responses (the target stays frozen), reading the target's
    features from the feature cache (built on first use). The budget is --epochs over the supervised
    positions (every response position anchors once per epoch) for every drafter. EAGLE uses training-time
    test: it is unrolled on its own outputs for --gamma steps. The parallel drafters (dflash, dspark,
    dspark-rnn) train on --anchors packed blocks per sequence; dspark adds the three-term loss of the paper.
    """
    from dspark.lab.training.drafters import train_drafter, trainer_state_path
    from dspark.lab.training.responses import load_responses, response_token_counts

    if args.keep_at and (min(args.keep_at) <= 0 or (not args.steps and max(args.keep_at) >= args.epochs)):
        raise UsageError(f"--keep-at takes epochs inside the run (0 < E < --epochs {args.epochs:g}); the end of "
                         "the run is --out itself")  # fmt: skip
    if args.qk_norm is None:  # the default: the reference drafter's layers for the parallel kinds
        args.qk_norm = args.kind in PARALLEL_KINDS
    if args.qk_norm and args.kind not in PARALLEL_KINDS:
        raise UsageError(f"--qk-norm is for the parallel kinds ({', '.join(PARALLEL_KINDS)}), "
                         f"not {args.kind}")  # fmt: skip
    if args.eagle3_layer and (args.kind != "eagle" or args.layers > 1):
        raise UsageError("--eagle3-layer is one layer of the eagle kind (--kind eagle, --layers 1)")
    target = load_training_target(args)
    if args.ship and args.target_name == "custom":
        raise UsageError("--ship: drafters are shipped for the tiny target and the known --model names only")
    out = Path(args.out) if args.out else trained_drafter_path(args.kind, args.target_name)
    if trainer_state_path(out).exists() and not args.resume:
        raise UsageError(f"an interrupted run left {trainer_state_path(out)}: pass --resume to continue it, or "
                         "delete that file to start afresh")  # fmt: skip
    train_set, val_set = feature_caches(args, target)
    gamma = 1 if args.kind == "mtp" else args.gamma
    torch.manual_seed(args.seed)
    drafter = new_drafter(
        target,
        args.kind,
        gamma,
        args.layers,
        args.rank,
        args.draft_vocab,
        args.width,
        qk_norm=args.qk_norm,
        eagle3_layer=args.eagle3_layer,
    ).to(model_device(target))
    drafter = fast_on_cpu(drafter)  # its training-time test runs inference (autograd keeps F.linear)
    if args.draft_vocab:  # the K ids the target writes most often in the training responses (EOS always)
        counts = response_token_counts(
            load_responses(Path(args.responses), "train"), target.config.vocab_size
        )
        drafter.vocab.set_ids(most_frequent(counts, args.draft_vocab, keep=(args.eos_id,)))
    tc = DrafterTrainConfig(epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, unroll=gamma,
                            anchors_per_seq=args.anchors, lr=args.lr, eval_every=args.eval_every,
                            position_decay=args.position_decay, ce_weight=args.ce_weight, soft_ce=args.soft_ce,
                            bf16=training_in_bf16(args.bf16, model_device(target)), seed=args.seed)  # fmt: skip
    source = args.model or Path(args.checkpoint).name
    meta = {"target_checkpoint": source, "tap_layers": list(target.config.tap_layers),
            "responses": len(train_set), "features": "live" if args.live else "cache"}  # fmt: skip
    meta = train_drafter(drafter, target, train_set, val_set, tc, out, meta, resume=args.resume,
                         keep_at=tuple(args.keep_at or ()))  # fmt: skip
    acc = " ".join(f"{a:.3f}" for a in meta["val_expected_acceptance"])
    print(f"saved {out}; {meta['epochs']:.2f} epochs, {meta['seconds'] / 60:.1f} min, "
          f"{meta['anchors_per_s']:.0f} anchors/s; validation expected acceptance per position: {acc}")  # fmt: skip
    if args.ship:
        shipped = default_path(args.kind, args.target_name)
        shipped.parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".safetensors", ".json"):
            if out.with_suffix(suffix).resolve() != shipped.with_suffix(suffix).resolve():
                shutil.copy(out.with_suffix(suffix), shipped.with_suffix(suffix))
        print(f"shipped it to {shipped}")
    else:
        print(
            f"use it with --drafter {args.kind} --drafter-checkpoint {out} (--ship copies it into the package)"
        )


def trained_drafter_path(kind: str, target_name: str) -> Path:
    """Where `train drafter` writes without --out: DSPARK_HOME[/<target>]/drafters/drafter_<kind>.safetensors
    (the shipped one in the package is replaced only by --ship)."""
    return storage.target_home(target_name) / "drafters" / f"drafter_{kind}.safetensors"
