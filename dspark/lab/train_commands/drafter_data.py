"""`train instructions | responses | features`: what a drafter learns from, made by the target itself.

`instructions` samples user requests from a chat target (Magpie) into a prompts file; `responses`
answers training prompts (the corpus's, or a prompts file's) again with the target, so that drafters
learn the target rather than the corpus; `features` caches the target's features of those responses,
which `train drafter` reads. `load_training_target` and `feature_caches` are shared with `train
drafter` (dspark/lab/train_commands/drafter.py).

What this file does not do: sample, filter or cache anything itself (dspark/lab/training/instructions.py,
responses.py, feature_cache.py do) or parse options (dspark/lab/commands/train.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.lab import cli, storage
from dspark.lab.cli import UsageError


def cmd_instructions(args: argparse.Namespace) -> None:
    """Sample user requests from a chat target given its template up to the user's turn (Magpie), steered
    towards code and math by the turn's opening, filtered (length, script, repetition, near-duplicates,
    domain) and split train / val / eval by a hash of the text. Resumes where it stopped.
    """
    from collections import Counter

    from dspark.lab.training.instructions import read_kept, sample_instructions

    tokenizer, target, target_name = cli.load_target(
        args, cli.device_of(args)
    )  # --out '' is refused by argparse
    if tokenizer.chat.name == "plain":
        raise UsageError("a model without a chat template has no user turn to sample (Magpie needs one)")
    out = Path(args.out or storage.target_home(target_name) / "instructions.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = {"chat": args.chat, "code": args.code, "math": args.math}
    dropped = sample_instructions(target, tokenizer, out, counts, args.batch_size, args.max_new_tokens,
                                  args.seed)  # fmt: skip
    kept = read_kept(out)
    print(f"{len(kept)} instructions in {out}")
    n = Counter((r["domain"], r["split"]) for r in kept)
    for d in counts:
        print(f"  {d:<5} train {n[d, 'train']:>6}  val {n[d, 'val']:>5}  eval {n[d, 'eval']:>5}")
    total = len(kept) + sum(dropped.values())
    print(f"dropped {sum(dropped.values())} of {total} samples: "
          + ", ".join(f"{k} {v}" for k, v in dropped.most_common()))  # fmt: skip


def cmd_responses(args: argparse.Namespace) -> None:
    """Answer training/validation prompts of the corpus again with the target, sampled at T = 1, so that drafters
    learn the target rather than the corpus. Resumes if interrupted.
    """
    from dspark.lab.data.prompt_files import read_prompts
    from dspark.lab.training.responses import answered_prompts, refuse_gzipped_output, regenerate

    device = cli.device_of(args)
    if args.per_domain == 0 and args.val_per_domain == 0:
        raise UsageError("--per-domain and --val-per-domain are both 0: there is nothing to generate")
    if args.out:  # before the target loads: not a .gz, nor a file that is not an earlier run's
        refuse_gzipped_output(args.out)
        answered_prompts(Path(args.out))
    if args.prompts is not None:
        source = read_prompts(args.prompts)  # before the target loads: a bad file is one line at once
    else:
        source = Path(args.data) / "corpus.jsonl"
        if not source.is_file():
            raise UsageError(f"no corpus in {args.data}; run `python -m dspark.train data` first")
    tokenizer, target, target_name = cli.load_target(args, device)
    out = Path(args.out or storage.target_home(target_name) / "responses.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    n = regenerate(target, tokenizer, source, out, args.per_domain, args.val_per_domain, args.max_new_tokens,
                   args.batch_size)  # fmt: skip
    print(f"{n} target responses in {out}")


def feature_caches(args: argparse.Namespace, target) -> tuple:
    """(train, val) feature sources for `train drafter`/`train features`: the caches under --features-dir,
    (re)built when missing or stale; with --live, live target passes instead."""
    from dspark.lab.training.feature_cache import LiveFeatures, response_caches
    from dspark.lab.training.responses import load_responses

    if getattr(args, "live", False):
        return tuple(LiveFeatures(target, load_responses(Path(args.responses), s)) for s in ("train", "val"))
    return response_caches(target, args.responses, args.features_dir)


def load_training_target(args: argparse.Namespace):
    """The frozen target (--checkpoint, or --model in --dtype), with --taps overriding the tap layers its
    drafters read. Resolves the target's default --responses and --features-dir (under
    `storage.target_home`) and records its name in `args.target_name`."""
    tokenizer, target, args.target_name = cli.load_target(args, cli.device_of(args))
    args.eos_id = tokenizer.eos_id
    args.responses, args.features_dir = storage.training_data(
        args.target_name, args.responses, args.features_dir
    )
    if args.taps:
        try:
            target.config.tap_layers = tuple(args.taps)
            target.config.__post_init__()
        except ValueError as exc:
            raise UsageError(f"--taps: {exc}") from None
    return target


def cmd_features(args: argparse.Namespace) -> None:
    """Run the target once over the regenerated responses and store, per token, its tap features and final
    hidden state (fp16, memory-mapped) under --features-dir; `train drafter` reads them. A cache made for
    another target, other taps or other responses is detected and rebuilt.
    """
    feature_caches(args, load_training_target(args))
