"""`python -m dspark.bench`: benchmarks that print tables (and JSON on request).

  ar   plain autoregressive decoding speed of the target at several batch sizes

Numbers are wall-clock on whatever machine runs the command; nothing here is
asserted by tests. Each measurement repeats `--repeats` times after a warm-up
and reports the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from dspark import paths
from dspark.checkpoint import load_target
from dspark.cli import UsageError, run_main
from dspark.data import load_eval_prompts
from dspark.generation import generate
from dspark.sampling import SamplingParams
from dspark.tokenizer import Tokenizer


def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def eval_prompt_ids(tokenizer: Tokenizer, n: int) -> list[list[int]]:
    """n held-out prompts, cycling through the domains (code, math, chat, code, ...)."""
    records = load_eval_prompts(paths.EVAL_PROMPTS_PATH)
    by_domain: dict[str, list[str]] = {}
    for r in records:
        by_domain.setdefault(r["domain"], []).append(r["prompt"])
    domains = list(by_domain)
    return [tokenizer.chat_prompt(by_domain[domains[i % len(domains)]][i // len(domains)]) for i in range(n)]


def bench_ar(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    model, meta = load_target(args.checkpoint)
    params = SamplingParams(temperature=0.0)
    rows = []
    for batch in args.batch_sizes:
        prompts = eval_prompt_ids(tokenizer, batch)
        room = model.config.max_seq_len - max(len(p) for p in prompts)
        if room < args.max_new_tokens:
            raise UsageError(
                f"--max-new-tokens {args.max_new_tokens} does not fit: only {room} positions left"
            )
        runs = []
        for rep in range(args.repeats + 1):  # the first run is a warm-up
            # eos_id=None: every request generates exactly max_new_tokens
            result = generate(model, prompts, args.max_new_tokens, params, eos_id=None)
            if rep:
                runs.append(result)
        decode_tps = [batch * (args.max_new_tokens - 1) / r.decode_seconds for r in runs]
        rows.append(
            {
                "batch": batch,
                "new_tokens_per_request": args.max_new_tokens,
                "tokens_per_s": statistics.median(r.tokens_per_s for r in runs),
                "decode_tokens_per_s": statistics.median(decode_tps),
                "tokens_per_s_per_request": statistics.median(r.tokens_per_s for r in runs) / batch,
                "ms_per_step": 1000 * statistics.median(r.decode_seconds / r.steps for r in runs),
                "prefill_ms": 1000 * statistics.median(r.prefill_seconds for r in runs),
            }
        )
    print(
        f"plain autoregressive decoding, greedy, {args.max_new_tokens} new tokens per request, "
        f"{torch.get_num_threads()} CPU threads, {model.num_parameters() / 1e6:.1f}M-parameter target\n"
    )
    print("| batch | tokens/s | decode tokens/s | tokens/s per request | ms per step | prefill ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['tokens_per_s']:.0f} | {r['decode_tokens_per_s']:.0f} | "
            f"{r['tokens_per_s_per_request']:.1f} | {r['ms_per_step']:.2f} | {r['prefill_ms']:.1f} |"
        )
    return {"benchmark": "ar", "threads": torch.get_num_threads(), "results": rows}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dspark.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    p = sub.add_parser(
        "ar",
        help="plain decoding tokens/s",
        description="Tokens/s of plain autoregressive greedy decoding with the target, at each batch size.",
    )
    p.add_argument(
        "--batch-sizes", type=parse_int_list, default=[1, 16], help="comma-separated (default: 1,16)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=128, help="tokens per request (default: %(default)s)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed runs after one warm-up (default: %(default)s)"
    )
    p.add_argument(
        "--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target weights (default: shipped)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(func=bench_ar)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if getattr(args, "max_new_tokens", 1) < 1 or getattr(args, "repeats", 1) < 1:
        raise UsageError("--max-new-tokens and --repeats must be at least 1")
    result = args.func(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    sys.exit(run_main(main))
