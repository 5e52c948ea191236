"""`python -m dspark.train`: every training command of the project.

  data       build the offline corpus, the tokenizer and the token arrays
  target     pre-train the target model (resumable)
  instructions  sample self-written user requests from a chat target (Magpie), filtered, into a prompts file
  responses  answer training prompts again with the target (drafter data)
  features   cache the target's features of those responses (what drafter training reads)
  drafter    train a drafter (mtp | eagle | dflash | dspark | dspark-rnn) on those responses
  calibrate  fit the confidence head's Sequential Temperature Scaling on held-out rounds

Outputs go under DSPARK_HOME (default ~/.cache/dspark) or to an explicit --out,
never into the package; `--ship` copies the compact result into
`dspark/assets/`, which is what gets committed (the maintainers' step). Every command
that runs the target or trains a drafter (responses, features, drafter,
calibrate) takes --device cpu|cuda; pre-training the tiny target runs on the CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from functools import partial
from pathlib import Path

import torch

from dspark import cli, paths
from dspark.checkpoint import config_path, load_target, save_checkpoint
from dspark.cli import UsageError, run_main
from dspark.cli import add_option as option
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
from dspark.device import cpu_has_bf16, model_device
from dspark.drafters.autoregressive import AutoregressiveDrafterConfig
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.drafters.registry import (
    DRAFTER_NAMES,
    calibration_path,
    checkpoint_digest,
    default_path,
    new_drafter,
)
from dspark.drafters.vocab import most_frequent
from dspark.training.drafters import DrafterTrainConfig
from dspark.training.target import TrainConfig, train_target

PARALLEL, AUTOREGRESSIVE = ParallelDrafterConfig(), AutoregressiveDrafterConfig()  # the drafters' defaults


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
    paths.write_text_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
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
        save_checkpoint(model, mc, paths.TARGET_CHECKPOINT, dtype=torch.float16, meta=meta)
        print(f"shipped fp16 weights to {paths.TARGET_CHECKPOINT}")


def cmd_instructions(args: argparse.Namespace) -> None:
    """Sample user requests from a chat target given its template up to the user's turn (Magpie), steered
    towards code and math by the turn's opening, filtered (length, script, repetition, near-duplicates,
    domain) and split train / val / eval by a hash of the text. Resumes where it stopped.
    """
    from collections import Counter

    from dspark.training.instructions import read_kept, sample_instructions

    tokenizer, target, target_name = cli.load_target(
        args, cli.device_of(args)
    )  # --out '' is refused by argparse
    if tokenizer.chat.name == "plain":
        raise UsageError("a model without a chat template has no user turn to sample (Magpie needs one)")
    out = Path(args.out or paths.target_home(target_name) / "instructions.jsonl")
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
    from dspark.data.prompt_files import read_prompts
    from dspark.training.responses import refuse_gzipped_output, regenerate

    device = cli.device_of(args)
    if args.per_domain == 0 and args.val_per_domain == 0:
        raise UsageError("--per-domain and --val-per-domain are both 0: there is nothing to generate")
    if args.out:  # before the target loads
        refuse_gzipped_output(args.out)
    if args.prompts is not None:
        source = read_prompts(args.prompts)  # before the target loads: a bad file is one line at once
    else:
        source = Path(args.data) / "corpus.jsonl"
        if not source.is_file():
            raise UsageError(f"no corpus in {args.data}; run `python -m dspark.train data` first")
    tokenizer, target, target_name = cli.load_target(args, device)
    out = Path(args.out or paths.target_home(target_name) / "responses.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    n = regenerate(target, tokenizer, source, out, args.per_domain, args.val_per_domain, args.max_new_tokens,
                   args.batch_size)  # fmt: skip
    print(f"{n} target responses in {out}")


def feature_caches(args: argparse.Namespace, target) -> tuple:
    """(train, val) feature sources for `train drafter`/`train features`: the caches under --features-dir,
    (re)built when missing or stale; with --live, live target passes instead."""
    from dspark.training.feature_cache import LiveFeatures, response_caches
    from dspark.training.responses import load_responses

    if getattr(args, "live", False):
        return tuple(LiveFeatures(target, load_responses(Path(args.responses), s)) for s in ("train", "val"))
    return response_caches(target, args.responses, args.features_dir)


def load_training_target(args: argparse.Namespace):
    """The frozen target (--checkpoint, or --model in --dtype), with --taps overriding the tap layers its
    drafters read. Resolves the target's default --responses and --features-dir (under
    `paths.target_home`) and records its name in `args.target_name`."""
    tokenizer, target, args.target_name = cli.load_target(args, cli.device_of(args))
    args.eos_id = tokenizer.eos_id
    home = paths.target_home(args.target_name)
    args.responses = args.responses or str(home / "responses.jsonl")
    args.features_dir = args.features_dir or str(home / "features")
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
    from dspark.training.drafters import train_drafter, trainer_state_path
    from dspark.training.responses import load_responses, response_token_counts

    if args.tied_rank and args.kind != "dspark":
        raise UsageError(f"--tied-rank is for the dspark kind (its Markov head), not {args.kind}")
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
        args.final_hidden,
        args.tied_rank,
        args.width,
        qk_norm=args.qk_norm,
        eagle3_layer=args.eagle3_layer,
    ).to(model_device(target))
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
    meta = train_drafter(drafter, target, train_set, val_set, tc, out, meta, resume=args.resume)
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
    return paths.target_home(target_name) / "drafters" / f"drafter_{kind}.safetensors"


def calibration_output(args: argparse.Namespace, checkpoint: Path, target_name: str) -> Path:
    """Where `train calibrate` stores what it fitted: --out; with --ship the shipped drafter's own JSON twin in
    the package; else `calibration_path` (under DSPARK_HOME for a shipped drafter, else beside the drafter)."""
    if args.out:
        if args.ship:
            raise UsageError("--out and --ship both say where the calibration goes: give one")
        return Path(args.out)
    if args.ship:
        if not paths.inside_package(checkpoint):
            raise UsageError(f"--ship stores the calibration of a shipped drafter, and {checkpoint} is not one "
                             "(without --ship it goes beside that checkpoint)")  # fmt: skip
        return config_path(checkpoint)
    return calibration_path(checkpoint, target_name)


def padded_sts(temps: torch.Tensor, reasons: list[str], positions: int) -> tuple[torch.Tensor, list[str]]:
    """STS fitted over the first --gamma positions extended to all the drafter's `positions`: T = 1 (and
    b = 0) where nothing was fitted, so that a stored calibration always covers every position."""
    missing = positions - temps.shape[-1]
    if missing <= 0:
        return temps, reasons
    identity = torch.ones(missing, dtype=temps.dtype, device=temps.device)
    if temps.dim() == 2:
        identity = torch.stack([identity, torch.zeros_like(identity)])
    note = [f"T = 1: not fitted (calibrated with --gamma {temps.shape[-1]})"] * missing
    return torch.cat([temps, identity], dim=-1), reasons + note


def cmd_calibrate(args: argparse.Namespace) -> None:
    """Decode eval prompts 40..79 of every domain with full verification, record each round's confidences and
    accepted length, fit one temperature per position left to right on half of the rounds (each minimising the
    ECE of the prefix survival with the earlier ones fixed), keep it only where the other half's ECE improves
    and enough rounds reach the position (else T = 1), and store them: for a shipped drafter under DSPARK_HOME
    (where `generate` and `bench` look first; --ship: into the package), for any other in its checkpoint's JSON,
    or in --out. `python -m dspark.bench calibration` then reports on prompts 0..39.
    """

    from dspark.drafters.registry import get_drafter
    from dspark.sampling import SamplingParams
    from dspark.scheduling import calibration
    from dspark.scheduling.scheduler import temperatures_and_offsets
    from dspark.study import offline

    tokenizer, target, target_name = cli.load_target(args)
    path = (
        Path(args.drafter_checkpoint) if args.drafter_checkpoint else default_path(args.drafter, target_name)
    )
    out = calibration_output(args, path, target_name)  # before the long recording
    drafter = get_drafter(args.drafter, target, path, target_name)
    if not drafter.has_confidence:
        with_head = ", ".join(kind for kind, head in PARALLEL_KINDS.items() if head != "none")
        raise UsageError(f"{args.drafter} has no trained confidence head to calibrate (use {with_head})")
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    first, last = calibration.FIT_PROMPTS

    def progress(domain: str, rounds) -> None:
        print(f"{domain}: {sum(map(len, rounds.accepted))} rounds recorded so far")

    rounds = offline.record_rounds(target, drafter, tokenizer, last - first, SamplingParams(args.temperature), gamma,
                                   args.max_new_tokens, start=first, on_domain=progress, samples=args.samples)  # fmt: skip
    conf, events, mask = rounds.calibration_arrays()
    temps, reasons = calibration.select_sts(conf, events, mask, shifts=args.shifts)
    rows = calibration.position_metrics(conf, events, mask, temps)
    temps, reasons = padded_sts(temps, reasons, drafter.max_gamma)
    info = {"rounds": int(conf.shape[0]), "gamma": gamma, "temperature": args.temperature,
            "prompts": f"eval prompts {first}..{last - 1} of each domain, {args.samples} sample(s) each",
            "selection": "fitted on even rounds, kept where odd rounds' ECE improves", "reasons": reasons,
            "checkpoint": str(path), "checkpoint_sha256": checkpoint_digest(path)}  # fmt: skip
    written = calibration.save_temperatures(out, temps, info)
    print(
        "\n| k | T_k | b_k | why | ECE before | ECE after (in-sample) | AUROC |\n|---:|---:|---:|---|---:|---:|---:|"
    )
    for t, b, r, why in zip(*(x.tolist() for x in temperatures_and_offsets(temps)), rows, reasons):
        auc = "-" if r["auroc"] is None else f"{r['auroc']:.3f}"
        print(f"| {r['k']} | {t:.3f} | {b:+.3f} | {why} | {100 * r['ece_before']:.1f}% | "
              f"{100 * r['ece_after']:.1f}% | {auc} |")  # fmt: skip
    print(f"\nstored the STS temperatures{' and logit offsets' * args.shifts} in {written}")
    home = calibration_path(path, target_name)
    if args.ship and home.is_file():
        print(f"note: {home} (an earlier calibration under DSPARK_HOME) is still read first; delete it to use the "
              "shipped one")  # fmt: skip


def add_optimizer(
    p: argparse.ArgumentParser, config: TrainConfig | DrafterTrainConfig, batch: str, evals: str
) -> None:
    """--steps, --batch-size, --lr, --eval-every and --seed, with `config`'s defaults."""
    if isinstance(config, DrafterTrainConfig):
        option(p, "--steps", config.steps, "optimizer steps, 0 = as many as --epochs takes", low=0)
    else:
        option(p, "--steps", config.steps, "optimizer steps", low=1)
    option(p, "--batch-size", config.batch_size, f"{batch} per step", low=1)
    option(p, "--lr", config.lr, "peak learning rate", low=0)
    option(p, "--eval-every", config.eval_every, f"steps between {evals}", low=1)
    cli.add_seed(p, config.seed)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.command_parser("python -m dspark.train", __doc__)
    command = partial(
        cli.add_command, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    )
    data_dir, responses = str(paths.data_dir()), str(paths.dspark_home() / "responses.jsonl")

    p = command(
        "instructions", cmd_instructions, "sample self-written user requests (Magpie) into a prompts file"
    )
    cli.add_outputs(
        p, "output JSON lines (default: DSPARK_HOME/NAME/instructions.jsonl)", None, "PATH", json=None
    )
    cli.add_target(p, pretrained=True)
    for domain, count in (("chat", 7200), ("code", 7200), ("math", 7200)):
        option(
            p, f"--{domain}", count, f"kept {domain} requests wanted (train, val and eval together)", low=0
        )
    cli.add_sampling(
        p, max_new_tokens=112, tokens_help="cap on a request's length (one cut off there is dropped)"
    )
    option(p, "--batch-size", 128, "requests sampled together", low=1)
    cli.add_seed(p)
    cli.add_threads(p)
    cli.add_device(p)

    p = command("data", cmd_data, "build corpus, tokenizer and token arrays")
    cli.add_outputs(p, "output directory (default: %(default)s)", data_dir, json=None)
    option(p, "--math-problems", MATH_PROBLEMS, "generated math problems", low=0)
    cli.add_seed(p, help="seed of the math generator")
    option(p, "--vocab-size", DEFAULT_VOCAB_SIZE, "BPE vocabulary", low=512)
    p.add_argument("--retrain-tokenizer", action="store_true",
                   help="learn a new tokenizer instead of reusing the shipped one")  # fmt: skip
    p.add_argument("--ship", action="store_true", help="copy tokenizer and eval prompts into dspark/assets/")

    p = command("target", cmd_target, "pre-train the target LM")
    option(p, "--data", data_dir, "corpus directory")
    cli.add_outputs(p, "run directory (default: %(default)s)", str(paths.runs_dir() / "target"), json=None)
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--ship", action="store_true", help="write fp16 weights to dspark/assets/ when done")
    mc, tc = ModelConfig(), TrainConfig()
    option(p, "--dim", mc.dim, "model width", low=1)
    option(p, "--layers", mc.n_layers, "blocks", low=1)
    option(p, "--heads", mc.n_heads, "query heads", low=1)
    option(p, "--kv-heads", mc.n_kv_heads, "key/value heads", low=1)
    option(p, "--ffn-hidden", mc.ffn_hidden, "SwiGLU width", low=1)
    option(p, "--context", mc.max_seq_len, "context length", low=2)
    p.add_argument("--taps", type=int, nargs="*", help=f"tap layers for drafters (default: {mc.tap_layers})")
    add_optimizer(p, tc, "windows", "validation + checkpoint")
    option(p, "--seq-len", tc.seq_len, "tokens per window", low=2)
    option(p, "--warmup", tc.warmup, "warm-up steps", low=0)
    cli.add_threads(p)

    p = command("responses", cmd_responses, "regenerate responses with the target (drafter data)")
    option(p, "--data", data_dir, "corpus directory")
    p.add_argument("--prompts", metavar="FILE", help="answer the train and val prompts of this prompts file "
                   "(JSON lines with prompt, domain, split, e.g. from `train instructions`; or one prompt per "
                   "line) instead of the corpus's")  # fmt: skip
    cli.add_outputs(p, f"output JSON lines (default: {responses}; with --model NAME: "
                    "DSPARK_HOME/NAME/responses.jsonl)", None, "PATH", json=None)  # fmt: skip
    cli.add_target(p, pretrained=True)
    option(
        p,
        "--per-domain",
        100_000,
        "train prompts per domain (the default takes every one: ~29k in all)",
        low=0,
    )
    option(p, "--val-per-domain", 48, "val prompts per domain", low=0)
    cli.add_sampling(p, max_new_tokens=160, tokens_help="response length cap")
    option(p, "--batch-size", 32, "prompts generated together", low=1)
    cli.add_threads(p)
    cli.add_device(p)

    def add_features(p: argparse.ArgumentParser) -> None:
        p.add_argument("--responses", metavar="PATH",
                       help=f"responses file (default: {responses}; with --model NAME: DSPARK_HOME/NAME/...)")  # fmt: skip
        p.add_argument("--features-dir", metavar="DIR", help="where feature caches live (default: DSPARK_HOME/"
                       "features; with --model NAME: DSPARK_HOME/NAME/features)")  # fmt: skip
        p.add_argument("--taps", type=int, nargs="*",
                       help="target layers the drafters read (default: the target's own tap_layers)")  # fmt: skip
        cli.add_target(p, pretrained=True)
        cli.add_threads(p)
        cli.add_device(p)

    p = command("features", cmd_features, "cache the target's features of the responses (drafter input)")
    add_features(p)

    kinds = [name for name in DRAFTER_NAMES if name != "none"]
    p = command("drafter", cmd_drafter, f"train a drafter ({', '.join(kinds)})")
    p.add_argument("--kind", choices=kinds, required=True, help="which drafter")
    add_features(p)
    p.add_argument(
        "--live", action="store_true", help="recompute the target's features every step (no cache)"
    )
    cli.add_outputs(p, "drafter checkpoint (default: DSPARK_HOME/drafters/drafter_<kind>.safetensors; with "
                    "--model NAME: DSPARK_HOME/NAME/drafters/...)", None, "PATH", json=None)  # fmt: skip
    p.add_argument("--ship", action="store_true", help="when done, also copy the checkpoint into dspark/assets/ "
                   "as the shipped drafter of its kind (what gets committed)")  # fmt: skip
    cli.add_gamma(p, "draft block length (EAGLE: unrolled steps; mtp: always 1)", default=PARALLEL.gamma)
    p.add_argument("--layers", type=cli.number(int, 0), default=0, help=f"drafter layers (default: {AUTOREGRESSIVE.n_layers} "
                   f"for mtp/eagle, {PARALLEL.n_layers} for the parallel ones)")  # fmt: skip
    option(p, "--rank", PARALLEL.rank, "DSpark sequential-head rank r", low=1)
    option(p, "--width", 0, "SwiGLU width of the drafter's layers (0 = the target's)", low=0)
    option(p, "--tied-rank", PARALLEL.tied_rank, "dspark only: r_t more Markov-head rank factored through the "
           "target's own embeddings (2 x dim x r_t weights, whatever the vocabulary)", low=0)  # fmt: skip
    option(p, "--draft-vocab", PARALLEL.draft_vocab, "score only the K ids the target writes most often in "
           "the training responses (q = 0 elsewhere: still lossless); 0 = the whole vocabulary", low=0)  # fmt: skip
    p.add_argument("--final-hidden", action="store_true",
                   help="eagle and the parallel kinds also read the target's final-normed hidden state (what "
                   "mtp reads) next to the tap layers")  # fmt: skip
    p.add_argument("--qk-norm", action=argparse.BooleanOptionalAction, default=PARALLEL.qk_norm,
                   help="parallel kinds: RMSNorm q and k per head before RoPE in every drafter layer (Qwen3's "
                   "q_norm/k_norm, as DeepSpec's drafter; the deepspec and speculators export formats need it)")  # fmt: skip
    p.add_argument("--eagle3-layer", action="store_true",
                   help="eagle: EAGLE-3's own decoder layer (the attention reads the normed token embedding and "
                   "feature side by side, 2 x dim; no W_in), the one the eagle3 export format holds")  # fmt: skip
    dc = DrafterTrainConfig()
    option(
        p, "--epochs", dc.epochs, "epochs over the supervised positions (the budget of every drafter)", low=0
    )
    option(
        p, "--anchors", dc.anchors_per_seq, "parallel drafters: anchors per sequence and pass, 0 = all", low=0
    )
    option(
        p,
        "--position-decay",
        dc.position_decay,
        "parallel drafters: position weight exp(-(k-1)/decay)",
        low=0.01,
    )
    option(
        p,
        "--ce-weight",
        dc.ce_weight,
        "dspark: cross-entropy weight, TV gets 1 - it (paper: 0.1)",
        low=0,
        high=1,
    )
    p.add_argument("--soft-ce", action=argparse.BooleanOptionalAction, default=dc.soft_ce,
                   help="dspark: cross-entropy against the target's distribution (--no-soft-ce: against the "
                   "sampled token, the paper's)")  # fmt: skip
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="drafter forward under bf16 autocast, losses in fp32 (--no-bf16: all fp32) (default: bf16 "
                   "where the CPU has BF16 instructions, fp32 where it would emulate them, 14x slower)")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run whose state lies next to --out (OUT.trainer.pt, written at "
                   "every validation) exactly where it stopped; same options required")  # fmt: skip
    add_optimizer(p, dc, "sequences", "validations")

    p = command(
        "calibrate", cmd_calibrate, "fit Sequential Temperature Scaling of a drafter's confidence head"
    )
    cli.add_drafter(p, tuple(PARALLEL_KINDS))
    cli.add_target(p, pretrained=True)
    cli.add_outputs(p, "JSON file to store the calibration in (default: for a shipped drafter DSPARK_HOME/"
                    "calibration/drafter_<kind>.json, with --model NAME DSPARK_HOME/NAME/calibration/...; for "
                    "any other, the drafter checkpoint's own JSON)", None, "PATH", json=None)  # fmt: skip
    p.add_argument("--ship", action="store_true",
                   help="store it in the shipped drafter's JSON in dspark/assets/ (what gets committed)")  # fmt: skip
    cli.add_sampling(p, temperature=1.0, max_new_tokens=96, tokens_help="tokens per prompt")
    option(p, "--samples", 2, "decodes of every fitting prompt (other random draws): more rounds to fit on",
           low=1)  # fmt: skip
    p.add_argument("--shifts", action=argparse.BooleanOptionalAction, default=True,
                   help="fit a logit offset b_k next to each temperature, c = sigmoid(logit(c) / T_k - b_k) "
                   "(--no-shifts: temperatures only, the paper's STS)")  # fmt: skip
    cli.add_threads(p)
    cli.add_device(p)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cli.apply_threads(args)  # 0 (the default): torch's own, one thread per physical core
    args.func(args)


if __name__ == "__main__":
    sys.exit(run_main(main))
