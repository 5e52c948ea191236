"""`python -m dspark.generate`: talk to the shipped target model.

With no prompt it runs a short demo, one prompt per domain (code, math, chat): a
held-out prompt of the tiny corpus for the shipped target, an everyday request
(`EVERYDAY_DEMO`) for a pretrained one (--model). Otherwise every positional
argument is a prompt; they are generated together as one batch.

By default the shipped DSpark drafter (parallel backbone + Markov head, γ = 7)
drafts. `--drafter none` decodes plainly; `mtp` (MTP-1, one draft token per round),
`eagle` (EAGLE-3 style), `dflash` (parallel) and `dspark` / `dspark-rnn`
(parallel + sequential head), and `prompt-lookup` (copies what followed the
last words earlier in the text; no training: pair it with --policy threshold so
only copied drafts are verified), with `--gamma` draft tokens per round, decode
speculatively: same output distribution (same text at --temperature 0),
fewer target passes. Tokens that came from accepted drafts are highlighted
(on a terminal) or wrapped in «» (when piped); the stats follow the text.

`--policy` decides how many of the γ drafts each round verifies: `fixed` (all),
`dspark` (Algorithm 1 on the drafter's calibrated confidences and this
machine's measured SPS profile), `dspark-async`, `threshold`, `goodput`,
`mtp1` or `none` (see dspark/scheduler.py). Any policy is lossless.

`--device cpu|cuda` picks where the model runs (default: cuda when available,
else cpu); the target and the drafter are moved there after loading, and the
same seed gives the same text on either (the random draws come from a CPU
generator). `--kernels` picks who runs the four hot paths (Markov head, rejection
sampler, verify attention, prefix scheduler): `auto` (Triton kernels for CUDA
tensors, the PyTorch references on the CPU), `reference`, or `triton`: every
hot path on its Triton kernel -- on `--device cpu` in Triton's CPU interpreter
(slow; the text is the same, which is the point).

`--compare` also decodes the same prompts plainly (after the drafter's run, same
settings) and prints one line: plain decoding's tokens/s, the drafter's, their
ratio and τ, and at --temperature 0 whether the text is the same (it must be).
The demo compares by default (`--no-compare` skips it). On the shipped 5 M
target a target pass costs little more than a drafting pass, so speculation
buys little there and can cost; `--model smollm2-135m` shows a real model.

`--json` prints ONE JSON object on stdout. For a single prompt its `text` is a
string and `new_tokens` an integer; for several prompts (or the demo) both are
lists with one entry per prompt, and `tokens_per_s` is the batch's total.
With a drafter it also holds `tau` (mean tokens per round, bonus included),
`rounds` and `acceptance_by_position` (position-wise conditional acceptance); both
count committed tokens, so a round that --max-new-tokens or EOS cuts counts only
the drafts it output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from dspark.decoding import GenerationResult, check_prompts, generate
from dspark.engine import SpeculativeResult, speculative_generate
from dspark.lab import cli
from dspark.lab.calibration import get_calibration
from dspark.lab.cli import UsageError, run_main
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.scheduler import COST_AWARE
from dspark.lab.data.corpus import eval_prompts_by_domain
from dspark.lab.data.prompt_files import held_out, read_prompts
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.study.gpu import measured_scheduler
from dspark.sampling import SamplingParams
from dspark.scheduler import POLICY_NAMES
from dspark.tokenizer import Tokenizer
from kernels import KERNEL_MODES, kernel_mode, kernels_as

# The demo of a pretrained target: requests as a new user types them, written by hand (not by any generator of
# the project's). The shipped tiny target knows only its corpus, so its demo takes that corpus's held-out prompts.
EVERYDAY_DEMO = {
    "code": "Write a Python function that returns the largest of three numbers.",
    "math": "If a pizza is cut into 8 slices and I eat 3, what fraction of the pizza is left?",
    "chat": "Tell me a fun fact about octopuses.",
}


def demo_prompts(target_name: str) -> dict[str, str]:
    """The demo's prompt per domain: the tiny corpus's first held-out one for the shipped target ("tiny"),
    `EVERYDAY_DEMO` for a pretrained one."""
    if target_name == "tiny":
        return {domain: prompts[0] for domain, prompts in eval_prompts_by_domain(per_domain=1).items()}
    return dict(EVERYDAY_DEMO)


def _colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything non-empty (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _style(text: str, sgr: int) -> str:
    """Bold (1) or dim (2) on a terminal, plain text when piped or with NO_COLOR."""
    return f"\033[{sgr}m{text}\033[0m" if _colour() else text


def _mark_drafted(tokenizer: Tokenizer, tokens: list[int], from_draft: list[bool]) -> str:
    """The decoded text with every run of accepted draft tokens marked (colour on a terminal, «» when piped or
    with NO_COLOR).

    The whole reply is decoded once and the marks are inserted at character offsets, so a character whose
    UTF-8 bytes are split across a draft/target boundary is never broken: it goes with the run that
    completes it. Without the marks the result is exactly `tokenizer.decode(tokens)`."""
    text = tokenizer.decode(tokens)
    cuts = [0]  # character offsets where a run starts
    for k in range(1, len(tokens)):
        if from_draft[k] != from_draft[k - 1]:  # complete characters before token k
            cuts.append(max(cuts[-1], len(tokenizer.decode(tokens[:k]).rstrip("\ufffd"))))
    cuts.append(len(text))
    pieces, drafted = [], bool(from_draft[0]) if tokens else False
    for start, end in zip(cuts, cuts[1:]):
        piece = text[start:end]
        if drafted and piece:
            piece = f"\033[32;4m{piece}\033[0m" if _colour() else f"«{piece}»"
        pieces.append(piece)
        drafted = not drafted
    return "".join(pieces)


DEFAULT_THRESHOLD = 0.5  # --policy threshold: verify drafts while their survival estimate is at least this


def comparison_line(drafter: str, result: SpeculativeResult, plain: GenerationResult, greedy: bool) -> str:
    """What speculation bought on these prompts: plain and speculative tokens/s, their ratio, τ, and at T = 0
    whether the text is the same."""
    line = (f"plain decoding {plain.tokens_per_s:.1f} tokens/s, {drafter} {result.tokens_per_s:.1f} tokens/s "
            f"({result.tokens_per_s / plain.tokens_per_s:.2f}x), tau {result.stats.tau:.2f}")  # fmt: skip
    if greedy:
        line += (
            ", the same text"
            if plain.tokens == result.tokens
            else ", A DIFFERENT TEXT (a bug: please report)"
        )
    return line


def build_parser() -> argparse.ArgumentParser:
    parser = cli.command_parser("python -m dspark.generate", __doc__)
    parser.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text (none: run the demo)")
    cli.add_sampling(
        parser, max_new_tokens=96, temperature=0.0, top=True, seed=0, tokens_help="tokens to generate"
    )
    parser.add_argument("--prompts", dest="prompts_file", metavar="FILE", type=cli.prompts_source,
                        help="decode the prompts of FILE together instead (JSON lines with \"prompt\" and optional "
                        "\"domain\", only the eval split of a file that has splits; or plain text, one prompt per "
                        f"line; or a public set: {', '.join(cli.PROMPT_SETS)}, fetched once)")  # fmt: skip
    cli.add_outputs(parser, json="stdout")
    cli.add_drafter(parser, cli.RUNNABLE_DRAFTERS, help="speculative drafter; none = plain decoding",
                    gamma_help="draft tokens per round (not mtp)")  # fmt: skip
    parser.add_argument("--policy", choices=POLICY_NAMES, default="fixed",
                        help="verify-length policy (default: %(default)s = verify every draft)")  # fmt: skip
    parser.add_argument("--threshold", type=cli.number(float, 0, 1), default=None,
                        help=f"survival threshold of --policy threshold, refused with any other policy "
                        f"(default: {DEFAULT_THRESHOLD})")  # fmt: skip
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                        help="also decode plainly and print what speculation bought (default: on for the demo)")  # fmt: skip
    cli.add_target(parser, tokenizer=True, pretrained=True)
    cli.add_threads(parser)
    cli.add_draft_cost(parser)
    cli.add_device(parser)
    parser.add_argument("--kernels", choices=KERNEL_MODES,
                        help="Triton kernels or PyTorch references for the hot paths; triton runs them in "
                        "Triton's interpreter on a CPU (default: $DSPARK_KERNELS, else auto)")  # fmt: skip
    return parser


def refuse_ignored_options(args: argparse.Namespace) -> None:
    """Options that do nothing with the chosen settings are refused, rather than silently ignored: those only a
    drafter uses with --drafter none (--gamma is refused by `cli.resolve_gamma`), --threshold with a policy other
    than threshold, --ignore-draft-cost with a policy that never weighs the drafting time."""
    if args.threshold is not None and args.policy != "threshold":
        raise UsageError(f"--threshold is the threshold policy's: add --policy threshold (--policy {args.policy} "
                         "ignores it)")  # fmt: skip
    if args.ignore_draft_cost and args.drafter != "none" and args.policy not in COST_AWARE:
        raise UsageError(f"--ignore-draft-cost is an ablation of the dspark and dspark-async policies: --policy "
                         f"{args.policy} never weighs the drafting time")  # fmt: skip
    if args.drafter != "none":
        return
    ignored = [flag for flag, given in (("--drafter-checkpoint", args.drafter_checkpoint is not None),
                                        ("--policy", args.policy != "fixed"), ("--compare", bool(args.compare)),
                                        ("--ignore-draft-cost", args.ignore_draft_cost)) if given]  # fmt: skip
    if ignored:
        raise UsageError(
            f"--drafter none decodes plainly: drop {' and '.join(ignored)} (only a drafter uses it)"
        )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    refuse_ignored_options(args)
    if args.prompts and args.prompts_file:
        raise UsageError("give prompts on the command line or --prompts FILE, not both")
    params = SamplingParams(args.temperature, args.top_k, args.top_p)  # validates
    for i, prompt in enumerate(args.prompts, start=1):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes on the command line arrive as lone surrogates
            raise UsageError(f"prompt {i} is not valid UTF-8 text") from None
        if not prompt.strip():
            raise UsageError("a prompt is empty; give some text or no prompt at all for the demo")
    cli.apply_threads(args)
    device = cli.device_of(args)  # one line if cuda is asked for and missing
    args.kernels = args.kernels or kernel_mode()  # DSPARK_KERNELS, checked here
    if args.kernels == "triton":
        if device.type == "cpu":  # CPU tensors: the kernels run in Triton's interpreter (set before Triton)
            os.environ.setdefault("TRITON_INTERPRET", "1")
        import kernels

        if not kernels.available():
            raise UsageError(f"--kernels triton: Triton is not usable here ({kernels.unavailable_reason()})")
    tokenizer, model, target_name = cli.load_target(args, device)
    if args.top_k > model.config.vocab_size:
        raise UsageError(
            f"--top-k must be at most the vocabulary size {model.config.vocab_size}, got {args.top_k}"
        )

    names = None  # how a prompt is called in an error: "prompt N", or its file and line
    if args.prompts_file is not None:
        records = held_out(read_prompts(args.prompts_file), args.prompts_file)
        labels, texts = [r.domain for r in records], [r.prompt for r in records]
        names = [f"{args.prompts_file} line {r.line}: the prompt with its chat template" for r in records]
    elif args.prompts:
        labels, texts = ["prompt"] * len(args.prompts), args.prompts
    else:
        by_domain = demo_prompts(target_name)
        labels, texts = list(by_domain), list(by_domain.values())
    demo = not args.prompts and args.prompts_file is None
    prompts = [tokenizer.chat_prompt(t) for t in texts]
    check_prompts(prompts, model.config.max_seq_len, names=names)  # before loading a drafter

    drafter = get_drafter(args.drafter, model, args.drafter_checkpoint, target_name)
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    generator = torch.Generator().manual_seed(args.seed)
    scheduler = None
    if args.drafter != "none":
        # STS: the calibration under DSPARK_HOME first, then the one shipped with the drafter
        temperatures = get_calibration(args.drafter, args.drafter_checkpoint, target_name, drafter.max_gamma)
        threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
        scheduler = measured_scheduler(args.policy, drafter, model, gamma, temperatures, threshold,
                                       cost_aware=not args.ignore_draft_cost)  # fmt: skip
    speculative_run = args.drafter != "none"
    with kernels_as(args.kernels):
        if not speculative_run:
            result = generate(model, prompts, args.max_new_tokens, params, generator, eos_id=tokenizer.eos_id)
        else:
            result = speculative_generate(model, drafter, prompts, args.max_new_tokens, params, gamma, generator,
                                          tokenizer.eos_id, scheduler, CostAwareEngine)  # fmt: skip
        plain = None
        if speculative_run and (args.compare if args.compare is not None else demo):  # same prompts, plainly
            plain = generate(model, prompts, args.max_new_tokens, params, torch.Generator().manual_seed(args.seed),
                             eos_id=tokenizer.eos_id)  # fmt: skip
    replies = [tokenizer.decode(t) for t in result.tokens]
    speculative = isinstance(result, SpeculativeResult)

    if args.json:
        single = len(replies) == 1
        record = {
            "text": replies[0] if single else replies,
            "new_tokens": len(result.tokens[0]) if single else [len(t) for t in result.tokens],
            "tokens_per_s": round(result.tokens_per_s, 2),
            "prompts": texts,
            "stop_reasons": result.stop_reasons,
            "drafter": args.drafter,
            "temperature": args.temperature,
            "seed": args.seed,
            "kernels": args.kernels,
            "device": device.type,
            "prefill_s": round(result.prefill_seconds, 4),
            "decode_s": round(result.decode_seconds, 4),
        }
        if speculative:
            stats = result.stats
            record |= {
                "gamma": gamma,
                "policy": args.policy,
                "mean_verify_len": round(stats.mean_verify_len, 4),
                "tau": round(stats.tau, 4),
                "rounds": stats.rounds,
                "acceptance_by_position": stats.acceptance_by_position(gamma),
            }
        if plain is not None:
            record |= {"plain_tokens_per_s": round(plain.tokens_per_s, 2),
                       "speedup": round(result.tokens_per_s / plain.tokens_per_s, 3)}  # fmt: skip
            if params.greedy:
                record["same_text_as_plain"] = plain.tokens == result.tokens
        print(json.dumps(record, ensure_ascii=False))
        return
    mode = "greedy" if params.greedy else f"T={args.temperature}"
    for i, (label, text, reply) in enumerate(zip(labels, texts, replies)):
        tokens, reason = result.tokens[i], result.stop_reasons[i]
        print(_style(f"[{label}]", 1), text.strip())
        print(_style(f"--- reply ({len(tokens)} tokens, stopped by {reason}) ---", 2))
        marked = _mark_drafted(tokenizer, tokens, result.from_draft[i]) if speculative else reply
        print(marked.rstrip() + "\n")
    how = "plain autoregressive decoding"
    if speculative:
        how = f"drafter {args.drafter}, gamma {gamma}, policy {args.policy}"
    print(
        f"{result.new_tokens} new tokens for {len(prompts)} prompt(s), {mode}, "
        f"{result.tokens_per_s:.1f} tokens/s ({how}, batch {len(prompts)}, on {device.type})"
    )
    if speculative:
        stats = result.stats
        rates = " ".join("-" if r is None else f"{r:.2f}" for r in stats.acceptance_by_position(gamma))
        print(
            f"tau {stats.tau:.2f} tokens per round over {stats.rounds} request-rounds; "
            f"acceptance by position: {rates}"
        )
    if plain is not None:
        print(comparison_line(args.drafter, result, plain, params.greedy))
        if demo and target_name == "tiny":
            print("(a 5 M target: a target pass costs little more than a drafting pass, so speculation buys little "
                  "here and can cost; --model smollm2-135m shows a real model)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(run_main(main))
