"""`python -m dspark.bench`: benchmarks that print tables (and JSON on request).

  ar         plain autoregressive decoding speed of the target at several batch sizes
  policies   batch 1: the default scheduler against plain decoding and every fixed
             verify length, per domain, with its decisions
  offline    speculative decoding per drafter, domain and temperature: tau,
             position-wise acceptance, single-stream tokens/s and speed-up over
             no drafter (paper Table 1 and Fig. 2 analogues), and every macro-tau
             ratio with a 95% paired interval; --tau-only: no clock, batched
  ratios     the same macro-tau ratios between the drafters of several offline runs'
             JSON (a drafter trained later against committed results)
  depth      tau against the number of drafter layers, DSpark vs DFlash (Fig. 3)
  budget     tau against training epochs, from one run's --keep-at snapshots per drafter
  gamma      tau against the verified block length, and per-round latency with
             and without the sequential head (Fig. 4)
  threshold  static confidence-threshold sweep over fully verified rounds (Fig. 5)
  training   drafter training speed: live target pass vs feature cache, anchor density, bf16
  calibration  ECE/AUROC/Brier of the prefix survival before/after STS (Fig. 6)
  confidence   the trained confidence head vs the drafter's own top probability
  appendix-a   the selection-bias counterexample through the real schedulers
  profile      SPS(B) measured here (cached) and modelled for an H200
  serve        throughput vs tokens/s per user of the real engine, per policy
  simulate     the same frontier on a GPU profile, replaying recorded rounds
  kernels      each Triton kernel against its PyTorch reference on a CUDA GPU
  gpu          everything above that matters on a CUDA GPU, in one JSON + markdown report
               (--dry-run: every section on the CPU at tiny sizes)

The offline-study commands write markdown tables and PNG figures with --out DIR
(the README's copies live in walkthrough/results/). Every benchmark writes its
result as JSON with --json PATH (a symlink: into its target), or with --json -
to stdout, the tables then going to stderr so that stdout is the JSON alone. The measurements themselves
are library functions (dspark/lab/study/offline.py, pareto.py, kernels.py, ...);
this file parses the options, dspark/lab/benchmarks/ calls the measurements and prints
(paper.py: the quality claims; speed.py: timings).

Every command that runs a model takes --device cpu|cuda (default: cuda when
available); the model is moved there after loading. Numbers are wall-clock on
whatever machine runs the command; nothing here is asserted by tests. Each measurement repeats `--repeats` times after a warm-up
and reports the median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from functools import partial

from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.lab import cli, profiles, storage
from dspark.lab.benchmarks.free import bench_confidence
from dspark.lab.benchmarks.paper import (
    bench_appendix_a,
    bench_budget,
    bench_calibration,
    bench_depth,
    bench_gamma,
    bench_offline,
    bench_ratios,
    bench_threshold,
)
from dspark.lab.benchmarks.policies import bench_policies
from dspark.lab.benchmarks.speed import (
    bench_ar,
    bench_gpu,
    bench_kernels,
    bench_profile,
    bench_serve,
    bench_simulate,
    bench_training,
    parse_training_settings,
)
from dspark.lab.calibration import FIT_PROMPTS
from dspark.lab.cli import UsageError, parse_float_list, parse_int_list, parse_name_list
from dspark.lab.cli import add_option as option
from dspark.lab.data.corpus import EVAL_PER_DOMAIN
from dspark.scheduler import POLICY_NAMES

MAX_ARRIVAL_SPAN_S = 3600.0  # bench serve --poisson: the requests must all arrive within an hour


# ---- options --------------------------------------------------------------------------------------------
def parse_policy_list(text: str) -> list[str]:
    names = parse_name_list(text)
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICY_NAMES)}")
    return names


def parse_depth_points(text: str) -> list[tuple[str, int]]:
    """KIND:LAYERS,... -> [(kind, layers)], each pair once."""
    points = []
    for item in parse_name_list(text):
        kind, _, layers = item.partition(":")
        if not kind or not layers.isdigit() or int(layers) < 1:
            raise argparse.ArgumentTypeError(f"expected KIND:LAYERS (e.g. dspark:5), got {item!r}")
        points.append((kind, int(layers)))
    if len(set(points)) < len(points):
        raise argparse.ArgumentTypeError(f"a (kind, layers) pair is given twice in {text!r}")
    return points


def add_study_options(p: argparse.ArgumentParser, prompts_per_domain: int, temperature: bool = True) -> None:
    """Options shared by the offline-study benchmarks."""
    option(p, "--prompts-per-domain", prompts_per_domain, f"held-out prompts per domain (at most "
           f"{EVAL_PER_DOMAIN} of the shipped set; a --prompts file: up to its own count)", low=1)  # fmt: skip
    cli.add_sampling(p, max_new_tokens=96, temperature=1.0 if temperature else None)
    cli.add_target(p, pretrained=True)
    cli.add_device(p)
    cli.add_outputs(p, "write the markdown table(s) and PNG figure(s) into DIR")


def add_frontier_options(p: argparse.ArgumentParser, concurrency: list[int], requests: int) -> None:
    """Options shared by serve and simulate."""
    p.add_argument("--policy", "--policies", dest="policies", type=parse_policy_list,
                   default=["none", "mtp1", "fixed", "goodput", "dspark", "dspark-async"],
                   help="comma-separated policies (default: none,mtp1,fixed,goodput,dspark,dspark-async)")  # fmt: skip
    p.add_argument("--concurrency", type=parse_int_list, default=concurrency,
                   help=f"comma-separated concurrencies (default: {','.join(map(str, concurrency))})")  # fmt: skip
    option(p, "--requests", requests, "requests per point", low=1)
    cli.add_sampling(p, temperature=1.0)
    cli.add_target(p, pretrained=True)
    cli.add_device(p)
    cli.add_outputs(p, "write the table and the PNG figures into DIR")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.command_parser("python -m dspark.bench", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    command = partial(cli.add_command, sub, threads=True)  # every benchmark takes --threads

    p = command("ar", bench_ar, "plain decoding tokens/s")
    p.add_argument(
        "--batch-sizes", type=parse_int_list, default=[1, 16], help="comma-separated (default: 1,16)"
    )
    cli.add_sampling(p, max_new_tokens=128)
    option(p, "--repeats", 3, "timed runs after one warm-up", low=1)
    cli.add_target(p, pretrained=True)
    cli.add_device(p)
    cli.add_outputs(p)

    p = command(
        "offline",
        bench_offline,
        "Table 1 + Fig. 2: tau, acceptance by position and speed-up per drafter and domain",
    )
    p.add_argument("--drafters", type=cli.parse_drafter_list, default=["mtp", "eagle"],
                   help="comma-separated shipped drafter names or LABEL=CHECKPOINT (default: mtp,eagle)")  # fmt: skip
    p.add_argument("--temperatures", type=cli.parse_temperature_list, default=[1.0],
                   help="comma-separated sampling temperatures (default: 1)")  # fmt: skip
    p.add_argument("--policy", choices=POLICY_NAMES, default=None,
                   help="verify-length policy, built as `generate --policy` builds it (drafters without a "
                   "confidence head verify every draft under a policy that ranks by confidences) (default: "
                   "dspark, generate's default: the paper's scheduler on this machine's costs; with --tau-only "
                   "fixed = verify every draft)")  # fmt: skip
    cli.add_draft_cost(p)
    p.add_argument("--tau-only", action="store_true",
                   help="measure tau and acceptance only: no plain decoding and no clock, --batch-size prompts "
                   "at a time (every draft verified; far faster over many prompts)")  # fmt: skip
    option(p, "--batch-size", 16, "prompts decoded together with --tau-only", low=1)
    cli.add_gamma(p)
    add_study_options(p, prompts_per_domain=8, temperature=False)
    cli.add_prompts_file(p)

    p = command(
        "policies", bench_policies, "batch 1: the default scheduler vs plain and every fixed verify length"
    )
    p.add_argument("--baselines", type=parse_name_list, default=[],
                   help="comma-separated shipped drafters run beside it, each verifying its whole block (e.g. mtp; "
                   "default: none)")  # fmt: skip
    p.add_argument("--lengths", type=parse_int_list, default=None,
                   help="comma-separated fixed verify lengths to run (default: every one, 1..gamma)")  # fmt: skip
    p.add_argument("--unlearnt", action="store_true",
                   help="also run the default scheduler on the one-off measured costs alone, not learning them from "
                   "the run's own steps (what the learning buys)")  # fmt: skip
    p.add_argument("--transformers", action="store_true",
                   help="also run Hugging Face transformers' greedy generate and its prompt-lookup decoding on the "
                   "same weights (needs --model and the bench extra: pip install -e '.[bench]')")  # fmt: skip
    cli.add_drafter(
        p, ("dspark", "dspark-rnn"), help="the drafter whose scheduler is measured", checkpoint=False
    )
    add_study_options(p, prompts_per_domain=4, temperature=False)
    cli.add_prompts_file(p)

    p = command("ratios", bench_ratios, "macro-tau ratios across the JSON of several offline runs")
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="`bench offline --json` files, same prompts")
    p.add_argument("--drafters", type=parse_name_list, default=[],
                   help="only these labels, in this order (A / B for A listed before B) (default: all)")  # fmt: skip
    cli.add_outputs(p, "write ratios.md into DIR")

    study_dir = storage.runs_dir() / "study"
    p = command("depth", bench_depth, "Fig. 3: tau against drafter layers")
    p.add_argument("--kinds", type=parse_name_list, default=["dspark", "dflash"],
                   help="drafter kinds (default: dspark,dflash)")  # fmt: skip
    p.add_argument("--layers", type=parse_int_list, default=[1, 2, 3], help="depths (default: 1,2,3)")
    p.add_argument("--points", type=parse_depth_points, metavar="KIND:LAYERS,...",
                   help="the (kind, layers) checkpoints to measure instead of every --kinds x --layers pair, "
                   "e.g. dspark:1,dspark:5,eagle:1")  # fmt: skip
    p.add_argument("--draft-batches", type=parse_int_list, default=[1, 16],
                   help="request counts at which one drafting pass is timed (default: 1,16)")  # fmt: skip
    option(p, "--study-dir", str(study_dir), "where the study checkpoints are (KIND_LLAYERS.safetensors)")
    p.add_argument("--with", dest="earlier", nargs="+", default=[], metavar="DEPTH.json",
                   help="also show the points of these earlier `bench depth --json` runs that are not measured "
                   "now (checkpoints of another session), with the machine each was timed on")  # fmt: skip
    cli.add_gamma(p)
    add_study_options(p, prompts_per_domain=16)
    cli.add_prompts_file(p)

    p = command("budget", bench_budget, "tau against training epochs (one run per drafter, its snapshots)")
    p.add_argument("--points", type=parse_depth_points, required=True, metavar="KIND:LAYERS,...",
                   help="the runs STUDY_DIR/KIND_LLAYERS.safetensors, e.g. dspark:5,dflash:5,eagle:1")  # fmt: skip
    p.add_argument("--marks", type=parse_float_list, default=[], metavar="E,...",
                   help="the epochs of each run's snapshots (train drafter --keep-at), e.g. 0.5,1,2; the run's "
                   "end is always measured")  # fmt: skip
    option(p, "--study-dir", str(study_dir), "where the runs are (KIND_LLAYERS.safetensors and snapshots)")
    cli.add_gamma(p)
    add_study_options(p, prompts_per_domain=16)
    cli.add_prompts_file(p)

    p = command(
        "gamma", bench_gamma, "Fig. 4: tau against gamma, and round latency with/without the sequential head"
    )
    p.add_argument("--drafters", type=cli.parse_drafter_list,
                   default=[f"{k}={study_dir / (k + '_g16.safetensors')}" for k in ("dspark", "dflash")],
                   help="comma-separated LABEL=CHECKPOINT (or shipped names) (default: dspark,dflash at γ=16 "
                   "in the study dir)")  # fmt: skip
    p.add_argument("--gammas", type=parse_int_list, default=[4, 8, 12, 16], help="(default: 4,8,12,16)")
    option(p, "--latency-batch", 16, "requests per timed round", low=1)
    option(p, "--repeats", 20, "timed rounds per point", low=1)
    add_study_options(p, prompts_per_domain=16)

    p = command("threshold", bench_threshold, "Fig. 5: static confidence-threshold sweep")
    cli.add_drafter(p, names=None, help="name or LABEL=CHECKPOINT", checkpoint=False)
    p.add_argument("--thresholds", type=cli.parse_fraction_list, default=[round(0.1 * i, 1) for i in range(10)],
                   help="comma-separated survival thresholds (default: 0,0.1,...,0.9)")  # fmt: skip
    add_study_options(p, prompts_per_domain=16)

    p = command(
        "calibration", bench_calibration, "ECE / AUROC / Brier of the prefix survival before and after STS"
    )
    cli.add_drafter(p, names=tuple(PARALLEL_KINDS))
    add_study_options(p, prompts_per_domain=40)
    option(p, "--samples", 4, "decodes of every held-out prompt (other random draws): more rounds, a lower ECE "
           "noise floor", low=1)  # fmt: skip
    cli.add_prompts_file(p)

    p = command(
        "confidence", bench_confidence, "the trained confidence head vs the free online confidence (same STS)"
    )
    cli.add_drafter(p, names=tuple(PARALLEL_KINDS))
    add_study_options(p, prompts_per_domain=40)
    option(p, "--fit-prompts-per-domain", FIT_PROMPTS[1] - FIT_PROMPTS[0], f"prompts per domain, from number "
           f"{FIT_PROMPTS[0]}, whose rounds fit both STS", low=1, high=FIT_PROMPTS[1] - FIT_PROMPTS[0])  # fmt: skip
    p.add_argument("--profile", choices=profiles.PROFILE_NAMES, default="h200",
                   help="SPS profile Algorithm 1 is replayed on (default: %(default)s; cpu: measured here, cached)")  # fmt: skip
    p.add_argument("--concurrency", type=parse_int_list, default=[1, 4, 16, 64],
                   help="comma-separated concurrencies of the replay (default: 1,4,16,64)")  # fmt: skip
    option(p, "--requests", 256, "requests per replayed point", low=1)
    cli.add_prompts_file(p)

    p = command("appendix-a", bench_appendix_a, "the paper's selection-bias counterexample, measured")
    option(p, "--draws", 100_000, "independent rounds", low=3)
    cli.add_seed(p)
    cli.add_outputs(p)

    p = command(
        "training", bench_training, "drafter training speed: live target vs feature cache, anchors, bf16"
    )
    p.add_argument("--drafters", type=parse_name_list, default=["dspark", "eagle", "mtp"],
                   help="comma-separated drafter kinds (default: dspark,eagle,mtp)")  # fmt: skip
    p.add_argument("--settings", type=parse_training_settings,
                   default=parse_training_settings("live:16:fp32,cache:16:fp32,cache:16:bf16,cache:64:bf16,cache:0:bf16"),
                   help="comma-separated FEATURES:ANCHORS:PRECISION, features live|cache, anchors 0 = all, "
                   "precision fp32|bf16 (default: live:16:fp32,cache:16:fp32,cache:16:bf16,cache:64:bf16,cache:0:bf16)")  # fmt: skip
    option(p, "--steps", 5, "timed steps per setting (after one warm-up)", low=1)
    option(p, "--batch-size", 8, "sequences per step", low=1)
    option(p, "--layers", 0, "drafter layers (0 = each kind's default)", low=0)
    p.add_argument("--rank", type=int, default=None, help="DSpark's Markov-head rank (default: the kind's)")
    option(
        p, "--draft-vocab", 0, "score only K target ids, as `train drafter --draft-vocab` (0 = all)", low=0
    )
    p.add_argument(
        "--responses", help="responses file (default: the target's responses.jsonl under DSPARK_HOME)"
    )
    p.add_argument(
        "--features-dir", help="where feature caches live (default: the target's, under DSPARK_HOME)"
    )
    cli.add_target(p, pretrained=True)
    cli.add_outputs(p, "write training_speed.md and training_speed.png into DIR")

    p = command("profile", bench_profile, "the SPS(B) throughput profiles the scheduler uses")
    p.add_argument("--refresh", action="store_true", help="measure again instead of using the cache")
    p.add_argument("--drafters", type=cli.parse_drafter_list, default=[],
                   help="also measure these drafters' drafting-cost tables (CPU; shipped names or "
                   "LABEL=CHECKPOINT), e.g. dspark (default: none)")  # fmt: skip
    cli.add_target(p, pretrained=True)
    cli.add_device(p)
    cli.add_outputs(p, "write sps_profiles.png into DIR")

    p = command("serve", bench_serve, "throughput vs tokens/s per user of the real engine on this CPU")
    add_frontier_options(p, concurrency=[1, 2, 4, 8, 16], requests=48)
    cli.add_sampling(p, max_new_tokens=64)
    cli.add_prompts_file(p)
    p.add_argument("--poisson", type=cli.number(float, 0), metavar="RATE",
                   help="requests arrive as a Poisson process at RATE per second (default: closed loop)")  # fmt: skip
    option(p, "--repeats", 1, "run the whole sweep this many times, interleaved; the table then shows medians and "
           "each policy's speed against plain decoding (and MTP-1) paired within a repeat, with 95%% intervals",
           low=1)  # fmt: skip
    cli.add_draft_cost(p)

    p = command(
        "simulate", bench_simulate, "the same frontier simulated on a GPU profile from recorded traces"
    )
    add_frontier_options(p, concurrency=[1, 2, 4, 8, 16, 32, 64, 128, 256], requests=2000)
    option(p, "--profile", "h200", "SPS profile (and drafting cost: measured for cpu, modelled for h200)",
           choices=profiles.PROFILE_NAMES)  # fmt: skip
    cli.add_draft_cost(p)
    p.add_argument("--refresh", action="store_true", help="record the drafter traces again")

    p = command("kernels", bench_kernels, "each Triton kernel against its PyTorch reference (CUDA GPU)")
    p.add_argument("--requests", dest="sizes", metavar="REQUESTS", type=parse_int_list,
                   help="comma-separated batch sizes (default: 1,16,64 on a GPU, 1,3 with --interpret)")  # fmt: skip
    cli.add_gamma(p, "draft block size γ", default=7)
    option(p, "--repeats", 50, "timed calls per measurement", low=1)
    cli.add_outputs(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--interpret", action="store_true",
                      help="run on the CPU under TRITON_INTERPRET=1 at tiny sizes (agreement only, not speed)")  # fmt: skip
    mode.add_argument("--compile-only", action="store_true",
                      help="no GPU needed: compile every kernel for --arch down to a cubin and report")  # fmt: skip
    option(p, "--arch", 90, "CUDA compute capability for --compile-only", low=1)

    p = command("gpu", bench_gpu, "kernels, SPS, decoding, engine, torch.compile on a CUDA GPU (one JSON)")
    p.add_argument("--dry-run", action="store_true",
                   help="every section on the CPU at tiny sizes, in seconds (plumbing, not speed)")  # fmt: skip
    cli.add_target(p)
    cli.add_device(p)
    cli.add_outputs(p, "write gpu.md into DIR")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli.apply_threads(args)
    poisson = getattr(args, "poisson", None)
    if poisson is not None and not poisson > 0:
        raise UsageError(f"--poisson must be a positive arrival rate, got {poisson:g}")
    if poisson is not None and args.requests / poisson > MAX_ARRIVAL_SPAN_S:
        raise UsageError(f"--poisson {poisson:g}: {args.requests} requests would take about {args.requests / poisson:.3g} s "
                         f"to arrive; use a rate of at least {args.requests / MAX_ARRIVAL_SPAN_S:.3g} per second")  # fmt: skip
    per_domain = getattr(args, "prompts_per_domain", None)
    if per_domain is not None and per_domain > EVAL_PER_DOMAIN and getattr(args, "prompts", None) is None:
        raise UsageError(f"--prompts-per-domain must be 1..{EVAL_PER_DOMAIN} for the shipped held-out prompts, got "
                         f"{per_domain} (a --prompts file takes up to its own count)")  # fmt: skip
    cli.refuse_clobber(args)  # --json/--out onto an input (--prompts, a RUN.json, ...) or into the package
    cli.prepare_outputs(getattr(args, "out", None), args.json)  # fail now, not after the measurement
    result = run_benchmark(args)
    ok = result.pop("ok", True)  # False: a check failed (kernels that disagree or do not compile)
    if args.json:
        write_json(args.json, result)
    return 0 if ok else 3


def run_benchmark(args: argparse.Namespace) -> dict:
    """The chosen benchmark's result. With `--json -` what it prints goes to stderr, so that standard
    output holds the JSON alone (`... --json - | jq` then works)."""
    if args.json != cli.STDOUT:
        return args.func(args)
    with contextlib.redirect_stdout(sys.stderr):
        return args.func(args)


def write_json(where: str, result: dict) -> None:
    """--json PATH, written whole (through a symlink: into its target), or `-`: standard output."""
    text = json.dumps(result, indent=2) + "\n"
    if where == cli.STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    storage.write_text_atomic(where, text)
    print(f"\nwrote {where}")
