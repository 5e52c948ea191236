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
This file parses the options; dspark/lab/train_commands/ holds the commands' bodies
(pretraining.py: data, target; drafter_data.py: instructions, responses, features;
drafter.py; calibrate.py), which call the library (dspark/training.py, dspark/tokenizer.py).
"""

from __future__ import annotations

import argparse
from functools import partial

from dspark.drafters import DRAFTER_NAMES
from dspark.drafters.autoregressive import AutoregressiveDrafterConfig
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.lab import cli, storage
from dspark.lab.cli import add_option as option
from dspark.lab.data.corpus import MATH_PROBLEMS
from dspark.lab.train_commands.calibrate import cmd_calibrate
from dspark.lab.train_commands.drafter import cmd_drafter
from dspark.lab.train_commands.drafter_data import cmd_features, cmd_instructions, cmd_responses
from dspark.lab.train_commands.pretraining import cmd_data, cmd_target
from dspark.lab.training.drafters import DrafterTrainConfig
from dspark.lab.training.target import DEFAULT_VOCAB_SIZE, TrainConfig
from dspark.model import ModelConfig

PARALLEL, AUTOREGRESSIVE = ParallelDrafterConfig(), AutoregressiveDrafterConfig()  # the drafters' defaults


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
    data_dir, responses = str(storage.data_dir()), str(storage.dspark_home() / "responses.jsonl")

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
    cli.add_outputs(p, "run directory (default: %(default)s)", str(storage.runs_dir() / "target"), json=None)
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
    option(p, "--draft-vocab", PARALLEL.draft_vocab, "score only the K ids the target writes most often in "
           "the training responses (q = 0 elsewhere: still lossless); 0 = the whole vocabulary", low=0)  # fmt: skip
    p.add_argument("--qk-norm", action=argparse.BooleanOptionalAction, default=None,
                   help="parallel kinds: RMSNorm q and k per head before RoPE in every drafter layer (Qwen3's "
                   "q_norm/k_norm, as DeepSpec's drafter; the deepspec and speculators export formats need it). "
                   "Default: on for the parallel kinds (measured not worse: walkthrough/RESULTS.md section 11)")  # fmt: skip
    p.add_argument("--eagle3-layer", action="store_true",
                   help="eagle: EAGLE-3's own decoder layer (the attention reads the normed token embedding and "
                   "feature side by side, 2 x dim; no W_in), the one the eagle3 export format holds")  # fmt: skip
    dc = DrafterTrainConfig()
    option(
        p, "--epochs", dc.epochs, "epochs over the supervised positions (the budget of every drafter)", low=0
    )
    p.add_argument("--keep-at", type=cli.number(float, 0), nargs="+", metavar="EPOCHS",
                   help="also keep a validated copy at these epochs (OUT.epochs-E.safetensors): the budget "
                   "curve of one run, e.g. --epochs 10 --keep-at 0.5 1 2 5")  # fmt: skip
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
    cli.add_prompts_file(p)
    cli.add_threads(p)
    cli.add_device(p)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cli.apply_threads(args)  # 0 (the default): torch's own, one thread per physical core
    cli.refuse_clobber(args)  # --out onto an input (--responses, --prompts, ...) or into the package
    args.func(args)
