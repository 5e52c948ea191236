"""`python -m dspark.train`: every training command of the project.

  data       build the offline corpus, the tokenizer and the token arrays
  target     pre-train the target model (resumable)
  responses  answer training prompts again with the target (drafter data)
  drafter    train a drafter (mtp | eagle | dflash | dspark | dspark-rnn) on those responses
  calibrate  fit the confidence head's Sequential Temperature Scaling on held-out rounds

Outputs go under DSPARK_HOME (default ~/.cache/dspark); `--ship` copies the
compact result into `dspark/assets/`, which is what gets committed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from dspark import paths
from dspark.checkpoint import save_checkpoint
from dspark.cli import UsageError, run_main
from dspark.config import ModelConfig
from dspark.data.corpus import (
    DOMAINS,
    MATH_PROBLEMS,
    build_samples,
    build_token_arrays,
    corpus_manifest,
    eval_prompts,
    write_jsonl,
)
from dspark.data.tokenizer import DEFAULT_VOCAB_SIZE, Tokenizer
from dspark.training.target import TrainConfig, train_target


def cmd_data(args: argparse.Namespace) -> None:
    out = Path(args.out)
    t0 = time.perf_counter()
    print("building samples (stdlib sources, docstrings, pydoc topics, math problems) ...")
    samples = build_samples(math_count=args.math_problems, seed=args.seed)
    manifest = corpus_manifest(samples, args.math_problems, args.seed)
    write_jsonl([s.__dict__ for s in samples], out / "corpus.jsonl")
    prompts = eval_prompts(samples)
    write_jsonl(prompts, out / "eval_prompts.jsonl")
    if args.retrain_tokenizer or not paths.TOKENIZER_PATH.is_file():
        print(f"training a byte-level BPE tokenizer, vocabulary {args.vocab_size} ...")
        texts = (s.prompt + "\n" + s.response for s in samples if s.split == "train")
        tokenizer = Tokenizer.train(texts, args.vocab_size)
        tokenizer.save(out / "tokenizer.json")
    else:
        print(f"using the shipped tokenizer {paths.TOKENIZER_PATH} (--retrain-tokenizer to learn a new one)")
        shutil.copy(paths.TOKENIZER_PATH, out / "tokenizer.json")
        tokenizer = Tokenizer.load(out / "tokenizer.json")
    print("tokenising ...")
    sizes = build_token_arrays(samples, tokenizer, out)
    manifest["tokens"] = sizes
    manifest["vocab_size"] = tokenizer.vocab_size
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
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
        shutil.copy(out / "tokenizer.json", paths.TOKENIZER_PATH)
        shutil.copy(out / "eval_prompts.jsonl", paths.EVAL_PROMPTS_PATH)
        shutil.copy(out / "manifest.json", paths.CORPUS_MANIFEST_PATH)
        print(f"shipped tokenizer, manifest and {len(prompts)} evaluation prompts to {paths.ASSETS_DIR}")
    print(f"done in {time.perf_counter() - t0:.0f}s; wrote {out}")


def cmd_target(args: argparse.Namespace) -> None:
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
        mc = ModelConfig(
            vocab_size=manifest["vocab_size"],
            dim=args.dim,
            n_layers=args.layers,
            n_heads=args.heads,
            n_kv_heads=args.kv_heads,
            ffn_hidden=args.ffn_hidden,
            max_seq_len=args.context,
            tap_layers=tuple(args.taps) if args.taps else ModelConfig.tap_layers,
        )
    if args.seq_len > mc.max_seq_len:
        raise UsageError(f"--seq-len {args.seq_len} exceeds --context {mc.max_seq_len}")
    tc = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup=args.warmup,
        eval_every=args.eval_every,
        checkpoint_every=args.eval_every,
        seed=args.seed,
    )
    torch.set_num_threads(args.threads)
    if not args.resume and (run / "model.safetensors").exists():
        raise UsageError(f"{run} already holds a run; pass --resume to continue it or choose another --out")
    meta = train_target(mc, tc, data, run, resume=args.resume, corpus_hash=manifest["sha256"])
    print("validation loss / perplexity per domain:")
    for d in DOMAINS:
        print(f"  {d:<5} loss {meta['val_loss'][d]:.3f}  ppl {meta['val_ppl'][d]:.2f}")
    if args.ship:
        from dspark.checkpoint import load_target

        model, _ = load_target(run / "model.safetensors")
        save_checkpoint(model, mc, paths.TARGET_CHECKPOINT, dtype=torch.float16, meta=meta)
        print(f"shipped fp16 weights to {paths.TARGET_CHECKPOINT}")


def cmd_responses(args: argparse.Namespace) -> None:
    from dspark.checkpoint import load_target
    from dspark.training.responses import regenerate

    corpus = Path(args.data) / "corpus.jsonl"
    if not corpus.is_file():
        raise UsageError(f"no corpus in {args.data}; run `python -m dspark.train data` first")
    torch.set_num_threads(args.threads)
    target, _ = load_target(args.checkpoint)
    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = regenerate(
        target,
        tokenizer,
        corpus,
        out,
        args.per_domain,
        args.val_per_domain,
        args.max_new_tokens,
        args.batch_size,
    )
    print(f"{n} target responses in {out}")


def cmd_drafter(args: argparse.Namespace) -> None:
    from dspark.checkpoint import load_target
    from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
    from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
    from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
    from dspark.drafters.registry import default_path
    from dspark.training.drafters import DrafterTrainConfig, train_drafter
    from dspark.training.responses import load_responses

    torch.set_num_threads(args.threads)
    target, target_meta = load_target(args.checkpoint)
    train_set, val_set = (
        load_responses(Path(args.responses), "train"),
        load_responses(Path(args.responses), "val"),
    )
    gamma = 1 if args.kind == "mtp" else args.gamma
    torch.manual_seed(args.seed)
    if args.kind in PARALLEL_KINDS:
        layers = args.layers or 2
        config = ParallelDrafterConfig(args.kind, gamma, layers, target.config.ffn_hidden, rank=args.rank)
        drafter = ParallelDrafter(target, config)
    else:
        config = AutoregressiveDrafterConfig(args.kind, gamma, args.layers or 1, target.config.ffn_hidden)
        drafter = AutoregressiveDrafter(target, config)
    tc = DrafterTrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        unroll=gamma,
        anchors_per_seq=args.anchors,
        lr=args.lr,
        eval_every=args.eval_every,
        seed=args.seed,
    )
    out = Path(args.out) if args.out else default_path(args.kind)
    meta = {"target_checkpoint": Path(args.checkpoint).name, "responses": len(train_set)}
    meta = train_drafter(drafter, target, train_set, val_set, tc, out, meta)
    acc = " ".join(f"{a:.3f}" for a in meta["val_expected_acceptance"])
    print(f"saved {out}; validation expected acceptance per step: {acc}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    from dspark.checkpoint import load_target
    from dspark.data.tokenizer import Tokenizer
    from dspark.drafters.registry import default_path, get_drafter
    from dspark.sampling import SamplingParams
    from dspark.scheduling import calibration
    from dspark.serving.rounds import RoundStats
    from dspark.study import offline

    torch.set_num_threads(args.threads)
    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    path = Path(args.drafter_checkpoint) if args.drafter_checkpoint else default_path(args.drafter)
    drafter = get_drafter(args.drafter, target, path)
    if not drafter.has_confidence:
        raise UsageError(
            f"{args.drafter} has no trained confidence head to calibrate (use dspark, dspark-rnn)"
        )
    gamma = min(args.gamma, drafter.max_gamma)
    params = SamplingParams(args.temperature)
    first, last = calibration.FIT_PROMPTS
    rounds = RoundStats()
    for domain, prompts in offline.prompts_by_domain(
        tokenizer, last - first, first, target.config.max_seq_len
    ).items():
        rounds.extend(offline.measure_tau(target, drafter, prompts, params, gamma, args.max_new_tokens,
                                        tokenizer.eos_id))  # fmt: skip
        print(f"{domain}: {sum(map(len, rounds.accepted))} rounds recorded so far")
    conf, events, mask = rounds.calibration_arrays()
    temps = calibration.fit_sts(conf, events, mask)
    rows = calibration.position_metrics(conf, events, mask, temps)
    info = {"rounds": int(conf.shape[0]), "gamma": gamma, "temperature": args.temperature,
            "prompts": f"eval prompts {first}..{last - 1} of each domain"}  # fmt: skip
    calibration.save_temperatures(path, temps, info)
    print("\n| k | T_k | ECE before | ECE after (in-sample) | AUROC |\n|---:|---:|---:|---:|---:|")
    for t, r in zip(temps.tolist(), rows):
        auc = "-" if r["auroc"] is None else f"{r['auroc']:.3f}"
        print(f"| {r['k']} | {t:.3f} | {100 * r['ece_before']:.1f}% | {100 * r['ece_after']:.1f}% | {auc} |")
    print(f"\nstored the STS temperatures in {calibration.config_path(path)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dspark.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "data",
        help="build corpus, tokenizer and token arrays",
        description="Build the three-domain corpus offline, (re)train the tokenizer, "
        "tokenise train/val splits and pick the held-out evaluation prompts.",
    )
    p.add_argument("--out", default=str(paths.data_dir()), help="output directory (default: %(default)s)")
    p.add_argument(
        "--math-problems",
        type=int,
        default=MATH_PROBLEMS,
        help="generated math problems (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the math generator (default: %(default)s)")
    p.add_argument(
        "--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="BPE vocabulary (default: %(default)s)"
    )
    p.add_argument(
        "--retrain-tokenizer",
        action="store_true",
        help="learn a new tokenizer instead of reusing the shipped one",
    )
    p.add_argument("--ship", action="store_true", help="copy tokenizer and eval prompts into dspark/assets/")
    p.set_defaults(func=cmd_data)

    d = ModelConfig()
    p = sub.add_parser(
        "target",
        help="pre-train the target LM",
        description="Pre-train the target model on the corpus built by `data`. "
        "Checkpoints every --eval-every steps; --resume continues an interrupted run.",
    )
    p.add_argument("--data", default=str(paths.data_dir()), help="corpus directory (default: %(default)s)")
    p.add_argument(
        "--out", default=str(paths.runs_dir() / "target"), help="run directory (default: %(default)s)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--ship", action="store_true", help="write fp16 weights to dspark/assets/ when done")
    p.add_argument("--dim", type=int, default=d.dim, help="model width (default: %(default)s)")
    p.add_argument("--layers", type=int, default=d.n_layers, help="blocks (default: %(default)s)")
    p.add_argument("--heads", type=int, default=d.n_heads, help="query heads (default: %(default)s)")
    p.add_argument(
        "--kv-heads", type=int, default=d.n_kv_heads, help="key/value heads (default: %(default)s)"
    )
    p.add_argument("--ffn-hidden", type=int, default=d.ffn_hidden, help="SwiGLU width (default: %(default)s)")
    p.add_argument("--context", type=int, default=d.max_seq_len, help="context length (default: %(default)s)")
    p.add_argument("--taps", type=int, nargs="*", help=f"tap layers for drafters (default: {d.tap_layers})")
    tc_defaults = TrainConfig()
    p.add_argument(
        "--steps", type=int, default=tc_defaults.steps, help="optimizer steps (default: %(default)s)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=tc_defaults.batch_size,
        help="windows per step (default: %(default)s)",
    )
    p.add_argument(
        "--seq-len", type=int, default=tc_defaults.seq_len, help="tokens per window (default: %(default)s)"
    )
    p.add_argument(
        "--lr", type=float, default=tc_defaults.lr, help="peak learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--warmup", type=int, default=tc_defaults.warmup, help="warm-up steps (default: %(default)s)"
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=tc_defaults.eval_every,
        help="steps between validation + checkpoint (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=tc_defaults.seed, help="random seed (default: %(default)s)")
    p.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: %(default)s)"
    )
    p.set_defaults(func=cmd_target)

    responses_default = paths.dspark_home() / "responses.jsonl"
    p = sub.add_parser(
        "responses",
        help="regenerate responses with the target (drafter data)",
        description="Answer training/validation prompts of the corpus again with the target, sampled at T = 1, "
        "so that drafters learn the target rather than the corpus. Resumes if interrupted.",
    )
    p.add_argument("--data", default=str(paths.data_dir()), help="corpus directory (default: %(default)s)")
    p.add_argument("--out", default=str(responses_default), help="output JSON lines (default: %(default)s)")
    p.add_argument("--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target (default: shipped)")
    p.add_argument(
        "--per-domain", type=int, default=2000, help="train prompts per domain (default: %(default)s)"
    )
    p.add_argument(
        "--val-per-domain", type=int, default=48, help="val prompts per domain (default: %(default)s)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=160, help="response length cap (default: %(default)s)"
    )
    p.add_argument(
        "--batch-size", type=int, default=32, help="prompts generated together (default: %(default)s)"
    )
    p.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: %(default)s)"
    )
    p.set_defaults(func=cmd_responses)

    p = sub.add_parser(
        "drafter",
        help="train a drafter (mtp, eagle, dflash, dspark, dspark-rnn)",
        description="Train a drafter on the target-regenerated responses (the target stays frozen). "
        "EAGLE uses training-time test: it is unrolled on its own outputs for --gamma steps. "
        "The parallel drafters (dflash, dspark, dspark-rnn) train on --anchors packed blocks per sequence; "
        "dspark adds the three-term loss of the paper.",
    )
    p.add_argument(
        "--kind",
        choices=("mtp", "eagle", "dflash", "dspark", "dspark-rnn"),
        required=True,
        help="which drafter",
    )
    p.add_argument(
        "--responses", default=str(responses_default), help="responses file (default: %(default)s)"
    )
    p.add_argument("--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target (default: shipped)")
    p.add_argument("--out", help="drafter checkpoint (default: dspark/assets/drafter_<kind>.safetensors)")
    p.add_argument(
        "--gamma",
        type=int,
        default=7,
        help="draft block length (EAGLE: unrolled steps) (default: %(default)s)",
    )
    p.add_argument(
        "--layers", type=int, default=0, help="drafter layers (default: 1 for mtp/eagle, 2 for parallel)"
    )
    p.add_argument(
        "--rank", type=int, default=64, help="DSpark sequential-head rank r (default: %(default)s)"
    )
    p.add_argument(
        "--anchors", type=int, default=16, help="parallel drafters: blocks per sequence (default: 16)"
    )
    p.add_argument("--steps", type=int, default=600, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument(
        "--eval-every", type=int, default=100, help="steps between validations (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: %(default)s)"
    )
    p.set_defaults(func=cmd_drafter)

    p = sub.add_parser(
        "calibrate",
        help="fit Sequential Temperature Scaling of a drafter's confidence head",
        description="Decode eval prompts 40..79 of every domain with full verification, record each round's "
        "confidences and accepted length, fit one temperature per position left to right (each minimising "
        "the ECE of the prefix survival with the earlier ones fixed) and store them in the drafter "
        "checkpoint's JSON. `python -m dspark.bench calibration` then reports on prompts 0..39.",
    )
    p.add_argument("--drafter", default="dspark", choices=("dflash", "dspark", "dspark-rnn"),
                   help="drafter name (default: %(default)s)")  # fmt: skip
    p.add_argument("--drafter-checkpoint", help="drafter weights (default: the shipped one)")
    p.add_argument("--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target (default: shipped)")
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per prompt (default: %(default)s)")
    p.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: %(default)s)"
    )
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    sys.exit(run_main(main))
