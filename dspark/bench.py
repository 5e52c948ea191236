"""`python -m dspark.bench`: benchmarks that print tables (and JSON on request).

  ar       plain autoregressive decoding speed of the target at several batch sizes
  offline  speculative decoding per drafter and domain: tau, position-wise
           acceptance, single-stream tokens/s and speed-up over no drafter

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
from dspark.data import eval_prompts_by_domain
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
    groups = list(eval_prompts_by_domain().values())
    return [tokenizer.chat_prompt(groups[i % len(groups)][i // len(groups)]) for i in range(n)]


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


def bench_offline(args: argparse.Namespace) -> dict:
    from dspark.drafters.registry import get_drafter
    from dspark.speculative import acceptance_by_position, speculative_generate, tokens_per_round

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    params = SamplingParams(temperature=args.temperature)
    drafters = {name: get_drafter(name, target) for name in args.drafters}
    rows = []
    for domain, texts in eval_prompts_by_domain(args.prompts_per_domain).items():
        prompts = [tokenizer.chat_prompt(t) for t in texts]
        generate(target, prompts[:1], 4, params)  # warm-up
        base_tokens = base_time = 0.0
        for i, prompt in enumerate(prompts):  # single stream: one request at a time
            r = generate(target, [prompt], args.max_new_tokens, params, torch.Generator().manual_seed(i),
                         tokenizer.eos_id)  # fmt: skip
            base_tokens += r.new_tokens
            base_time += r.prefill_seconds + r.decode_seconds
        base_tps = base_tokens / base_time
        rows.append({"drafter": "none", "domain": domain, "temperature": args.temperature, "gamma": 0,
                     "tau": 1.0, "cond_acceptance": [], "tokens_per_s": base_tps, "speedup": 1.0})  # fmt: skip
        for name, drafter in drafters.items():
            gamma = min(args.gamma, drafter.max_gamma)
            n_tokens = seconds = 0.0
            lens, accs = [], []
            for i, prompt in enumerate(prompts):
                r = speculative_generate(target, drafter, [prompt], args.max_new_tokens, params, gamma,
                                         torch.Generator().manual_seed(i), tokenizer.eos_id)  # fmt: skip
                n_tokens += r.new_tokens
                seconds += r.prefill_seconds + r.decode_seconds
                lens += r.verify_lens
                accs += r.accepted
            tps = n_tokens / seconds
            rows.append({"drafter": name, "domain": domain, "temperature": args.temperature, "gamma": gamma,
                         "tau": tokens_per_round(accs), "cond_acceptance": acceptance_by_position(lens, accs, gamma),
                         "tokens_per_s": tps, "speedup": tps / base_tps})  # fmt: skip
    print(f"offline speculative decoding, T = {args.temperature}, gamma = {args.gamma}, "
          f"{args.prompts_per_domain} held-out prompts per domain, batch 1, {torch.get_num_threads()} CPU threads\n")  # fmt: skip
    print("| drafter | domain | tau | tokens/s | speed-up | conditional acceptance by position |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["cond_acceptance"])
        print(f"| {r['drafter']} | {r['domain']} | {r['tau']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{r['speedup']:.2f}x | {acc} |")  # fmt: skip
    return {"benchmark": "offline", "results": rows}


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

    p = sub.add_parser(
        "offline",
        help="tau, acceptance and speed-up per drafter and domain",
        description="Speculative decoding on the held-out prompts, one request at a time: per drafter and "
        "domain, tau (tokens per round incl. the bonus), position-wise conditional acceptance, tokens/s "
        "and the speed-up over plain decoding (--drafter none) on this machine.",
    )
    p.add_argument("--drafters", type=lambda t: [x for x in t.split(",") if x], default=["mtp", "eagle"],
                   help="comma-separated drafter names (default: mtp,eagle)")  # fmt: skip
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)"
    )
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    p.add_argument(
        "--prompts-per-domain", type=int, default=8, help="held-out prompts (default: %(default)s)"
    )
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per request (default: %(default)s)")
    p.add_argument(
        "--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target weights (default: shipped)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(func=bench_offline)
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
