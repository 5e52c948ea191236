"""`python -m dspark.bench`: benchmarks that print tables (and JSON on request).

  ar         plain autoregressive decoding speed of the target at several batch sizes
  offline    speculative decoding per drafter, domain and temperature: tau,
             position-wise acceptance, single-stream tokens/s and speed-up over
             no drafter (paper Table 1 and Fig. 2 analogues), and every macro-tau
             ratio with a 95% paired interval; --tau-only: no clock, batched
  depth      tau against the number of drafter layers, DSpark vs DFlash (Fig. 3)
  gamma      tau against the verified block length, and per-round latency with
             and without the sequential head (Fig. 4)
  threshold  static confidence-threshold sweep over fully verified rounds (Fig. 5)
  training   drafter training speed: live target pass vs feature cache, anchor density, bf16
  calibration  ECE/AUROC/Brier of the prefix survival before/after STS (Fig. 6)
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
are library functions (dspark/study/offline.py, pareto.py, kernels.py, ...);
this file parses the options, calls them and prints.

Every command that runs a model takes --device cpu|cuda (default: cuda when
available); the model is moved there after loading. Numbers are wall-clock on
whatever machine runs the command; nothing here is asserted by tests. Each measurement repeats `--repeats` times after a warm-up
and reports the median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch

import kernels
from dspark import cli, paths
from dspark.checkpoint import load_target
from dspark.cli import UsageError, parse_float_list, parse_int_list, parse_name_list, run_main
from dspark.cli import add_option as option
from dspark.data.corpus import DOMAINS, EVAL_PER_DOMAIN
from dspark.data.tokenizer import Tokenizer
from dspark.device import cpu_description, model_device
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.registry import (
    default_path,
    find_calibration,
    get_calibration,
    get_drafter,
    labelled_specs,
    new_drafter,
)
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.scheduling import calibration, profiler
from dspark.scheduling.scheduler import POLICY_NAMES, make_policy, temperatures_and_offsets
from dspark.scheduling.step import VerifyScheduler
from dspark.serving.step_cost import engine_draft_cost
from dspark.study import gpu, offline, pareto, plots, tables, tau_intervals
from dspark.study import kernels as kernel_study

MAX_ARRIVAL_SPAN_S = 3600.0  # bench serve --poisson: the requests must all arrive within an hour


def load_model(args: argparse.Namespace, device: torch.device | None = None) -> tuple[Tokenizer, Transformer]:
    """The tokenizer and the target (--checkpoint, or --model in --dtype), moved to --device (or `device`);
    the target's name (for its shipped drafters) goes into `args.target_name`."""
    tokenizer, target, args.target_name = cli.load_target(args, device or cli.device_of(args))
    return tokenizer, target


def study_prompts(args: argparse.Namespace, tokenizer: Tokenizer, target: Transformer) -> dict:
    """--prompts-per-domain held-out prompts of each domain (token ids) that fit the target's context."""
    return offline.prompts_by_domain(tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len,
                                     getattr(args, "prompts", None))  # fmt: skip


def write_outputs(args: argparse.Namespace, stem: str, table: str, plot) -> None:
    """With --out DIR: DIR/<stem>.md holds `table`; `plot(DIR)` draws the figure(s) there."""
    if not args.out:
        return
    out = Path(args.out)
    paths.write_text_atomic(out / f"{stem}.md", table)
    plot(out)
    print(f"wrote {out / stem}.md and its figure(s)")


def dtype_name(target: Transformer) -> str:
    """The target's weight dtype, as the --dtype option spells it."""
    return str(target.embed.weight.dtype).removeprefix("torch.")


def policy_for(policy: str, drafter) -> str:
    """`policy` for a drafter it can run with; `fixed` for one without the confidences it ranks by."""
    return "fixed" if make_policy(policy).needs_confidence and not drafter.has_confidence else policy


def bench_ar(args: argparse.Namespace) -> dict:
    """Tokens/s of plain autoregressive greedy decoding with the target, at each batch size."""
    if args.max_new_tokens < 2:
        raise UsageError("--max-new-tokens must be at least 2 for ar: decode speed needs a decode step")
    available = len(DOMAINS) * EVAL_PER_DOMAIN  # held-out prompts, cycled through the domains
    if max(args.batch_sizes) > available:
        raise UsageError(f"--batch-sizes must be at most {available} (the held-out prompts), got "
                         f"{max(args.batch_sizes)}")  # fmt: skip
    tokenizer, model = load_model(args)
    longest = max(map(len, offline.eval_prompt_ids(tokenizer, max(args.batch_sizes))))
    room = model.config.max_seq_len - longest
    if room < args.max_new_tokens:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} does not fit: only {room} positions left")
    rows = offline.run_ar(model, tokenizer, args.batch_sizes, args.max_new_tokens, args.repeats)
    machine = cpu_description()
    print(
        f"plain autoregressive decoding, greedy, {args.max_new_tokens} new tokens per request, "
        f"{machine}, {model.num_parameters() / 1e6:.1f}M-parameter target\n"
    )
    print(tables.ar_table(rows), end="")
    return {"benchmark": "ar", "threads": torch.get_num_threads(), "machine": machine, "results": rows}


def bench_offline(args: argparse.Namespace) -> dict:
    """Speculative decoding on the held-out prompts, one request at a time: per drafter, domain and temperature,
    tau (tokens per round incl. the bonus), position-wise conditional acceptance, tokens/s and the speed-up
    over plain decoding on this machine, and every pair's macro-tau ratio with a 95% paired bootstrap interval
    (prompts resampled). --tau-only skips the clock and plain decoding and runs --batch-size prompts at a time.
    With --out: table1.md and position_acceptance_T<t>.png (paper Table 1 and Fig. 2 analogues). With --policy
    the drafters run `generate --policy`'s scheduler, so the speed-up is that of `python -m dspark.generate
    --drafter NAME --policy P` against `--drafter none`.
    """
    tokenizer, target = load_model(args)
    by_domain = study_prompts(args, tokenizer, target)  # a bad --prompts file fails before the drafters load
    drafters = offline.load_labelled_drafters(target, args.drafters, args.target_name)
    gammas = {
        name: cli.resolve_gamma(args.gamma, d, name, mtp_drafts_one=True) for name, d in drafters.items()
    }
    checkpoints = {label: path or None for label, path in labelled_specs(args.drafters)}
    policies = {name: policy_for(args.policy, d) for name, d in drafters.items()}

    def scheduler_for(name: str, drafter) -> VerifyScheduler | None:
        """The scheduler `generate --policy` builds (fresh per request: it learns from its rounds)."""
        temperatures = get_calibration(name, checkpoints[name], args.target_name, drafter.max_gamma)
        return gpu.measured_scheduler(policies[name], drafter, target, gammas[name], temperatures,
                                      cost_aware=not args.ignore_draft_cost)  # fmt: skip

    if args.tau_only:
        if args.policy != "fixed":
            raise UsageError("--tau-only verifies every draft: use it with --policy fixed (the default)")
        rows = offline.run_tau(target, drafters, by_domain, args.temperatures, gammas, args.max_new_tokens,
                               tokenizer.eos_id, args.batch_size)  # fmt: skip
    else:
        rows = offline.run_speedup(target, drafters, by_domain, args.temperatures, gammas, args.max_new_tokens,
                                   tokenizer.eos_id, scheduler_for)  # fmt: skip
    batch = f"tau only, batch {args.batch_size}" if args.tau_only else "batch 1"
    print(f"offline speculative decoding, gamma {', '.join(f'{n} {g}' for n, g in gammas.items())}, policy "
          f"{', '.join(f'{n} {p}' for n, p in policies.items())}, {args.prompts_per_domain} held-out prompts "
          f"{'of ' + args.prompts + ' ' if args.prompts else ''}"
          f"per domain, {batch}, {cpu_description()}, {dtype_name(target)}\n")  # fmt: skip
    print(tables.speedup_table(rows), end="")
    table = tables.table1(rows)
    print("\nTable 1 analogue: tau (tokens per round incl. the bonus token)\n\n" + table)
    ratios = tau_intervals.ratio_rows(rows)
    if ratios:
        ratio_table = tables.ratio_table(ratios)
        table += "\n" + ratio_table
        print(ratio_table)

    def plot(out: Path) -> None:
        for temperature in args.temperatures:
            sub = [r for r in rows if r["temperature"] == temperature]
            plots.plot_position_acceptance(sub, out / f"position_acceptance_T{temperature:g}.png",
                                           f"conditional acceptance by position, T = {temperature:g}")  # fmt: skip

    write_outputs(args, "table1", table, plot)
    return {"benchmark": "offline", "gamma": gammas, "policy": policies, "dtype": dtype_name(target),
            "tau_only": args.tau_only, "results": rows, "macro_tau_ratios": ratios}  # fmt: skip


def bench_depth(args: argparse.Namespace) -> dict:
    """tau per domain of drafters trained with 1, 2, ... backbone layers, read from
    STUDY_DIR/<kind>_L<layers>.safetensors (train them with `python -m dspark.train drafter --layers N --out
    ...`). With --out: depth.md and depth.png (paper Fig. 3 analogue).
    """
    tokenizer, target = load_model(args)
    checkpoints = {(kind, n): Path(args.study_dir) / f"{kind}_L{n}.safetensors"
                   for kind in args.kinds for n in args.layers}  # fmt: skip
    for (kind, n), path in checkpoints.items():
        if not path.is_file():
            raise UsageError(f"missing {path}: train it with `python -m dspark.train drafter --kind {kind} "
                             f"--layers {n} --epochs 0.5 --out {path}`")  # fmt: skip
    rows = offline.run_depth(target, checkpoints, study_prompts(args, tokenizer, target),
                             SamplingParams(args.temperature), args.gamma, args.max_new_tokens, tokenizer.eos_id)  # fmt: skip
    table = tables.depth_table(rows)
    gamma = args.gamma or "each drafter's own"
    print(f"drafter depth, gamma = {gamma}, T = {args.temperature:g}, tau\n\n" + table)
    write_outputs(args, "depth", table, lambda out: plots.plot_depth(rows, out / "depth.png"))
    return {"benchmark": "depth", "gamma": args.gamma, "temperature": args.temperature, "results": rows}


def bench_gamma(args: argparse.Namespace) -> dict:
    """For drafters trained with a long block (default: the γ=16 study checkpoints), tau per domain when only the
    first γ drafts of each block are verified, and the median wall-clock of one round (drafting γ tokens + the
    target pass over anchor + γ drafts) at --latency-batch requests. dflash is the same backbone without the
    sequential head. With --out: gamma.md and gamma.png (paper Fig. 4 analogue).
    """
    tokenizer, target = load_model(args)
    drafters = offline.load_labelled_drafters(target, args.drafters, args.target_name)
    for label, drafter in drafters.items():
        if drafter.name not in PARALLEL_KINDS:
            raise UsageError(
                f"{label}: the gamma study compares the parallel drafters ({', '.join(PARALLEL_KINDS)})"
            )
        if max(args.gammas) > drafter.max_gamma:
            raise UsageError(f"drafter {label} drafts at most {drafter.max_gamma} tokens; lower --gammas")
    tau_rows, latency_rows = offline.run_gamma(
        target, drafters, study_prompts(args, tokenizer, target), SamplingParams(args.temperature), args.gammas,
        args.max_new_tokens, tokenizer.eos_id, args.latency_batch, args.repeats,
    )  # fmt: skip
    table = tables.gamma_table(tau_rows, latency_rows, args.latency_batch)
    print(f"proposal length, T = {args.temperature:g}: tau and per-round latency\n\n" + table)
    write_outputs(
        args, "gamma", table, lambda out: plots.plot_gamma(tau_rows, latency_rows, out / "gamma.png")
    )
    return {"benchmark": "gamma", "temperature": args.temperature, "tau": tau_rows, "latency": latency_rows}


def bench_threshold(args: argparse.Namespace) -> dict:
    """Fully verified rounds of a DSpark drafter on the held-out prompts, replayed under static thresholds on the
    prefix survival Π c_j: accepted and rejected draft tokens per step and the acceptance rate. With --out:
    threshold.md and threshold.png (paper Fig. 5 analogue).
    """
    tokenizer, target = load_model(args)
    ((label, drafter),) = offline.load_labelled_drafters(target, [args.drafter], args.target_name).items()
    gamma = cli.resolve_gamma(args.gamma, drafter, label)
    rows = offline.run_threshold(target, drafter, study_prompts(args, tokenizer, target),
                                 SamplingParams(args.temperature), gamma, args.max_new_tokens, tokenizer.eos_id,
                                 args.thresholds)  # fmt: skip
    table = tables.threshold_table(rows)
    print(f"static survival-threshold sweep, {label}, gamma = {gamma}, T = {args.temperature:g}\n\n" + table)
    write_outputs(args, "threshold", table, lambda out: plots.plot_threshold(rows, out / "threshold.png"))
    return {"benchmark": "threshold", "drafter": label, "gamma": gamma, "results": rows}


def bench_calibration(args: argparse.Namespace) -> dict:
    """Decode held-out eval prompts (0..N-1 per domain; STS was fitted on 40..79) with full verification and
    score the prefix survival of every position against 'drafts 1..k accepted': ECE before and after
    Sequential Temperature Scaling, AUROC, Brier. With --out: calibration.md and reliability.png (paper Fig. 6
    analogue). Run `python -m dspark.train calibrate` first.
    """
    tokenizer, target = load_model(args)
    path = (
        Path(args.drafter_checkpoint)
        if args.drafter_checkpoint
        else default_path(args.drafter, args.target_name)
    )
    drafter = get_drafter(args.drafter, target, path)
    if not drafter.has_confidence:
        raise UsageError(
            f"{args.drafter} has no trained confidence head to calibrate (use dspark, dspark-rnn)"
        )
    temperatures = find_calibration(path, args.target_name, drafter.max_gamma)  # DSPARK_HOME's first
    if temperatures is None:
        raise UsageError(
            f"{path} is not calibrated yet: run `python -m dspark.train calibrate --drafter {args.drafter}`"
        )
    if args.prompts_per_domain > calibration.FIT_PROMPTS[0]:
        raise UsageError(
            f"--prompts-per-domain must be <= {calibration.FIT_PROMPTS[0]} (later prompts fit STS)"
        )
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    rounds = offline.record_rounds(target, drafter, tokenizer, args.prompts_per_domain,
                                   SamplingParams(args.temperature), gamma, args.max_new_tokens,
                                   samples=args.samples)  # fmt: skip
    conf, events, mask = rounds.calibration_arrays()
    rows = calibration.position_metrics(conf, events, mask, temperatures)
    table = tables.calibration_table(rows)
    print(f"calibration of {args.drafter} on held-out rounds (eval prompts 0..{args.prompts_per_domain - 1} per "
          f"domain, {args.samples} sample(s) each, T = {args.temperature:g}, gamma = {gamma}), STS "
          f"{calibration.describe_sts(temperatures)}\n\n" + table)  # fmt: skip
    title = f"{args.drafter}: prefix survival, before (raw) and after STS"
    write_outputs(args, "calibration", table, lambda out: plots.plot_reliability(
        conf, events, mask, temperatures, out / "reliability.png", title))  # fmt: skip
    temps, offsets = temperatures_and_offsets(temperatures)
    keys = ("k", "ece_before", "ece_after", "ece_change_95", "auroc", "brier", "rounds", "survival_rate",
            "ece_noise_floor")  # fmt: skip
    return {"benchmark": "calibration", "drafter": args.drafter, "rounds": int(conf.shape[0]),
            "sts_temperatures": temps.tolist(), "sts_shifts": offsets.tolist() if temperatures.dim() == 2 else None,
            "samples": args.samples,
            "positions": [{k: r[k] for k in keys} for r in rows]}  # fmt: skip


def bench_appendix_a(args: argparse.Namespace) -> dict:
    """Paper Appendix A: one request, gamma 2, target (0.7, 0.3), draft (0.5, 0.5), a Markov confidence that
    depends on the first draft, SPS(1..3) = 1, 0.5, 0.45. Prints the first-token law under the retrospective
    scheduler (lossy: about (0.85, 0.15)), Algorithm 1 with the early stop and the asynchronous variant (both
    (0.7, 0.3)).
    """

    from dspark.study.counterexample import counterexample

    if args.draws < 3:
        raise UsageError("--draws must be at least 3")
    result = counterexample(args.draws, args.seed)
    print(f"paper Appendix A through the real verify + schedulers, {args.draws} independent rounds\n")
    print("| scheduler | P(A) | P(B) | mean verify length |\n|---|---:|---:|---:|")
    print(f"| target | {result['target'][0]:.3f} | {result['target'][1]:.3f} | |")
    for name in ("retrospective", "early_stop", "async"):
        pa, pb = result[name]
        print(f"| {name} | {pa:.3f} | {pb:.3f} | {result[name + '_mean_verify_len']:.2f} |")
    return {k: result[k] for k in ("target", "retrospective", "early_stop", "async", "draws")}


def bench_training(args: argparse.Namespace) -> dict:
    """Time drafter training steps on the regenerated responses under several settings: features from a live
    target pass (as before the feature cache) or from the cache, anchors per sequence, fp32 or bf16. Prints
    seconds per step, anchors (blocks) per second and supervised (anchor, position) pairs per second, and the
    speed-up over the first setting of each drafter. Builds the feature cache first if it is missing.
    """
    from dspark.study.training_speed import training_speed_table
    from dspark.training.drafters import DrafterTrainConfig
    from dspark.training.feature_cache import LiveFeatures, response_caches
    from dspark.training.responses import load_responses

    target = load_target(args.checkpoint)[0]
    cache, _ = response_caches(target, args.responses, args.features_dir)
    sources = {"cache": cache, "live": LiveFeatures(target, load_responses(Path(args.responses), "train"))}
    rows = []
    for kind in args.drafters:

        def make(kind=kind):
            torch.manual_seed(0)
            return new_drafter(target, kind)

        settings = [dict(zip(("features", "anchors", "bf16"), s)) for s in args.settings]
        if kind not in PARALLEL_KINDS:  # every chain is supervised: the anchor density does not apply
            settings = [dict(t) for t in dict.fromkeys(tuple({**s, "anchors": 0}.items()) for s in settings)]
        tc = DrafterTrainConfig(batch_size=args.batch_size)
        measured = training_speed_table(make, target, sources, settings, tc, args.steps)
        for row in measured:
            row.update(drafter=kind, speedup=row["anchors_per_s"] / measured[0]["anchors_per_s"])
            print(f"{kind}: {row['features']}, anchors {row['anchors'] or 'all'}, {'bf16' if row['bf16'] else 'fp32'}: "
                  f"{row['seconds_per_step']:.2f} s/step, {row['anchors_per_s']:.0f} anchors/s")  # fmt: skip
        rows += measured
    table = tables.training_speed_table(rows)
    print(f"\ndrafter training speed, batch {args.batch_size} sequences, median of {args.steps} steps "
          f"(torch threads {torch.get_num_threads()}):\n\n{table}")  # fmt: skip
    write_outputs(
        args, "training_speed", table, lambda out: plots.plot_training_speed(rows, out / "training_speed.png")
    )
    return {"benchmark": "training", "batch_size": args.batch_size, "steps": args.steps, "rows": rows}


def parse_training_settings(text: str) -> list[tuple[str, int, bool]]:
    """'live:16:fp32,cache:0:bf16' -> [("live", 16, False), ("cache", 0, True)]."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if (
            len(parts) != 3
            or parts[0] not in ("live", "cache")
            or parts[2] not in ("fp32", "bf16")
            or not parts[1].isdigit()
        ):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not FEATURES:ANCHORS:PRECISION (e.g. cache:0:bf16)"
            )
        out.append((parts[0], int(parts[1]), parts[2] == "bf16"))
    return out


def bench_profile(args: argparse.Namespace) -> dict:
    """Measure (once, then cached under DSPARK_HOME) how many target passes per second this machine does at B
    batch tokens, and print it next to the H200 roofline models (smooth, and with CUDA-graph buckets). With
    --drafters, also each drafter's drafting-cost table, the other half of what the cost-aware policies
    (`--policy dspark|dspark-async`) read; measuring both here saves the minutes it takes on first use (SmolLM2).
    With --out: sps_profiles.png.
    """
    _, target = load_model(args)
    if args.drafters and model_device(target).type != "cpu":
        raise UsageError("--drafters: the drafting cost is measured on the CPU only (a GPU's is modelled)")
    drafters = offline.load_labelled_drafters(target, args.drafters, args.target_name)
    measured = gpu.device_profile(target, refresh=args.refresh)  # the CPU's, or the GPU's on --device cuda
    profiles = [measured, profiler.named_profile("h200"), profiler.named_profile("h200-buckets")]
    points = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    print(f"SPS(B): target passes per second at B batch tokens (first: {args.target_name} measured here on --device "
          "and cached; h200: roofline model of an 8B bf16 model)\n")  # fmt: skip
    print("| B | " + " | ".join(p.name for p in profiles) + " |\n|---:|" + "---:|" * len(profiles))
    for b in points:
        cells = [f"{p.sps(b):.1f}" if b <= p.max_tokens else "-" for p in profiles]
        print(f"| {b} | " + " | ".join(cells) + " |")
    costs = {}
    for name, drafter in drafters.items():
        gamma = drafter.max_gamma
        cost = engine_draft_cost(target, drafter, gamma, refresh=args.refresh)
        costs[name] = {"gamma": gamma, "seconds_by_requests": cost.seconds_by_requests}
        sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= len(cost.seconds_by_requests)]
        print(f"\ndrafting cost of {name} (γ = {gamma}), ms per drafting pass at n drafting requests: "
              + ", ".join(f"n = {n}: {1e3 * cost.seconds(n):.1f}" for n in sizes))  # fmt: skip
    if args.out:  # a figure only
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plots.plot_profiles(profiles, Path(args.out) / "sps_profiles.png", max_tokens=512)
        print(f"\nwrote {Path(args.out) / 'sps_profiles.png'}")
    return {"benchmark": "profile", "target": args.target_name, "draft_costs": costs,
            "profiles": [{"name": p.name, "steps_per_second": p.steps_per_second} for p in profiles]}  # fmt: skip


def report_points(points: list[dict], args: argparse.Namespace, title: str, stem: str) -> None:
    report = pareto.frontier_report(points, args.policies)
    print(f"{title}\n\n{report}")

    def plot(out: Path) -> None:
        plots.plot_frontier(points, out / f"{stem}_frontier.png", title)
        plots.plot_load(points, out / f"{stem}_load.png", title)

    write_outputs(args, stem, report, plot)


def bench_serve(args: argparse.Namespace) -> dict:
    """Closed-loop serving with the real engine at each concurrency: every policy (none: plain decoding; mtp1:
    the MTP-1 drafter; the others: the DSpark drafter with its confidences and this machine's measured SPS
    profile). With --out: serve.md, serve_frontier.png, serve_load.png.
    """
    if args.max_new_tokens < 2:
        raise UsageError("--max-new-tokens must be at least 2 for serve: the per-user speed is measured between "
                         "a request's first and last token")  # fmt: skip
    tokenizer, target = load_model(args)
    points = pareto.serve_points(target, tokenizer, args.policies, args.concurrency, args.requests, args.max_new_tokens,
                                 gpu.device_profile(target), SamplingParams(args.temperature),
                                 arrival_rate=args.poisson, cost_aware=not args.ignore_draft_cost,
                                 target_name=args.target_name, repeats=args.repeats,
                                 prompts_file=args.prompts)  # fmt: skip
    mode = f"Poisson arrivals at {args.poisson:g}/s" if args.poisson else "closed loop"
    device = model_device(target)
    machine = cpu_description() if device.type == "cpu" else gpu.device_name(device)
    where = f"this CPU ({machine}" if device.type == "cpu" else f"{machine} ("
    title = (f"measured on {where}, {mode}): {args.requests} requests of up "
             f"to {args.max_new_tokens} tokens, T = {args.temperature:g}")  # fmt: skip
    if args.repeats > 1:
        title += f"; medians of {args.repeats} interleaved repeats"
    report_points(points, args, title, "serve")
    return {"benchmark": "serve", "machine": machine, "points": points}


def bench_simulate(args: argparse.Namespace) -> dict:
    """Trace-driven simulation: rounds recorded from the real drafters on held-out prompts (cached under
    DSPARK_HOME) replayed through each policy and a GPU SPS profile (h200: roofline, h200-buckets: with
    CUDA-graph padding). With --out: simulate_<profile>.md and the frontier / load PNGs.
    """
    if args.profile == "cpu" and cli.device_of(args).type != "cpu":
        raise UsageError("--profile cpu is measured on the CPU (with its drafting cost): add --device cpu")
    tokenizer, target = load_model(args)
    profile = profiler.named_profile(args.profile, target)
    traces = pareto.policy_traces(
        target, tokenizer, args.policies, SamplingParams(args.temperature), args.refresh, args.target_name
    )
    if args.profile == "cpu":  # measured here, like the profile
        costs = {name: engine_draft_cost(target, get_drafter(name, target, target_name=args.target_name), gamma)
                 for name, gamma in (("dspark", 7), ("mtp", 1))}  # fmt: skip
    else:
        costs = pareto.gpu_draft_costs()
    points = pareto.simulate_points(traces, args.policies, args.concurrency, args.requests, profile, costs,
                                    cost_aware=not args.ignore_draft_cost)  # fmt: skip
    aware = (
        "ignored by the policies (ablation)" if args.ignore_draft_cost else "weighed by dspark/dspark-async"
    )
    title = (f"simulated on the {profile.name} profile: traces of the real drafters, T = {args.temperature:g}; "
             f"drafting cost {aware}")  # fmt: skip
    report_points(points, args, title, f"simulate_{args.profile}")
    return {"benchmark": "simulate", "profile": args.profile, "points": points}


def bench_kernels(args: argparse.Namespace) -> dict:
    """Time each Triton kernel (Markov sampler, rejection sampler, ragged verify attention, prefix scheduler)
    against its PyTorch reference on a CUDA GPU, at the shipped model's shapes, and check that they agree.
    Without a CUDA GPU it exits with a message (status 1); --interpret runs the agreement checks on the CPU in
    Triton's interpreter at tiny sizes (timings say nothing about speed), --compile-only compiles every kernel
    for --arch down to a cubin. Exits with status 3 if a kernel disagrees with its reference or does not
    compile.
    """
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton and the kernel modules are imported
    if args.compile_only and kernels.interpreting():
        raise UsageError("--compile-only needs the real compiler: unset TRITON_INTERPRET")
    if not kernels.available():
        raise UsageError(
            f"Triton is not usable here ({kernels.unavailable_reason()}); nothing to time.", status=1
        )
    if args.compile_only:
        print(f"# every kernel compiled for sm_{args.arch} (no GPU needed; nothing runs)\n")
        print("| kernel variant | compile s | result |\n|---|---:|---|")
        rows = kernel_study.compile_all(args.arch)
        for row in rows:
            print(f"| {row['kernel']} | {row['seconds']:.1f} | {row['result']} |")
        return {"arch": args.arch, "rows": rows, "ok": all(row["result"].startswith("ok") for row in rows)}
    cuda = torch.cuda.is_available() and not args.interpret
    if not cuda and not args.interpret:
        raise UsageError(
            "no CUDA GPU here (torch.cuda.is_available() is False). The kernels' speed can only be measured "
            "on a GPU; on a CPU they run in Triton's interpreter, which checks correctness (python -m pytest "
            "tests/test_kernel_*.py) but not speed. Add --interpret to run this benchmark's agreement checks "
            "on the CPU anyway.",
            status=1,
        )
    sizes = args.sizes or (kernel_study.GPU_SIZES if cuda else kernel_study.INTERPRETER_SIZES)
    repeats = args.repeats if cuda else 1
    device = torch.cuda.get_device_name() if cuda else "interpreter on CPU: timings are NOT speed"
    print(f"# kernels vs references ({device}; γ = {args.gamma}, median of {repeats})\n")
    print(
        "| kernel | requests | reference ms | kernel ms | speed-up | agreement |\n|---|---:|---:|---:|---:|---|"
    )
    rows = []
    for row in kernel_study.compare(sizes, args.gamma, repeats, cuda):
        rows.append(row)
        print(f"| {row['kernel']} | {row['requests']} | {row['reference_ms']:.3f} | {row['kernel_ms']:.3f} | "
              f"{row['speedup']:.2f}× | {row['agreement']} |")  # fmt: skip
    return {"device": device, "gamma": args.gamma, "rows": rows,
            "ok": all("DIFFER" not in row["agreement"] for row in rows)}  # fmt: skip


def bench_gpu(args: argparse.Namespace) -> dict:
    """On a CUDA GPU, in one JSON (--json) and one markdown report (--out DIR/gpu.md): (a) each Triton kernel
    against its reference at the shipped shapes, (b) SPS(B) measured on the GPU, (c) plain vs speculative
    decoding at batch 1 per drafter (mtp, eagle, dflash, dspark) and the engine at C = 1, 4, 16, 64, 256 for the
    policies none, mtp1, fixed, dspark, (d) one target step plain vs torch.compile, and the host syncs per engine
    step. Sized for about 8 minutes of an H200. --dry-run runs every section on the CPU at tiny sizes (kernels in
    Triton's interpreter) in seconds: it checks the plumbing, not speed. Without CUDA (and without --dry-run) it
    exits with a message (status 1).
    """
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: kernels interpreted
        device, plan = torch.device("cpu"), gpu.DRY_PLAN
    else:
        device, plan = cli.device_of(args), gpu.GPU_PLAN
        if device.type != "cuda":
            raise UsageError("bench gpu measures a CUDA GPU and there is none here (or --device cpu was given); "
                             "--dry-run runs every section on the CPU at tiny sizes", status=1)  # fmt: skip
    where = "the CPU, tiny sizes" if args.dry_run else gpu.device_name(device)
    print(f"expected run time: about {plan.expected_s} s on {where} "
          f"(sections: {', '.join(f'{k} ~{v} s' for k, v in gpu.EXPECTED_S.items())} on an H200)")  # fmt: skip
    tokenizer, target = load_model(args, device)
    record = gpu.run(target, tokenizer, plan)
    md = gpu.report(record)
    print("\n" + md)
    write_outputs(args, "gpu", md, lambda out: None)
    return record


# ---- options --------------------------------------------------------------------------------------------
def parse_policy_list(text: str) -> list[str]:
    names = parse_name_list(text)
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICY_NAMES)}")
    return names


def add_study_options(p: argparse.ArgumentParser, prompts_per_domain: int, temperature: bool = True) -> None:
    """Options shared by the offline-study benchmarks."""
    option(p, "--prompts-per-domain", prompts_per_domain, "held-out prompts per domain", low=1,
           high=EVAL_PER_DOMAIN)  # fmt: skip
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
    p.add_argument("--temperatures", type=parse_float_list, default=[1.0],
                   help="comma-separated sampling temperatures (default: 1)")  # fmt: skip
    p.add_argument("--policy", choices=POLICY_NAMES, default="fixed",
                   help="verify-length policy, built as `generate --policy` builds it (drafters without a "
                   "confidence head verify every draft under a policy that ranks by confidences) "
                   "(default: %(default)s = verify every draft)")  # fmt: skip
    cli.add_draft_cost(p)
    p.add_argument("--tau-only", action="store_true",
                   help="measure tau and acceptance only: no plain decoding and no clock, --batch-size prompts "
                   "at a time (every draft verified; far faster over many prompts)")  # fmt: skip
    option(p, "--batch-size", 16, "prompts decoded together with --tau-only", low=1)
    cli.add_gamma(p)
    add_study_options(p, prompts_per_domain=8, temperature=False)
    cli.add_prompts_file(p)

    study_dir = paths.runs_dir() / "study"
    p = command("depth", bench_depth, "Fig. 3: tau against drafter layers")
    p.add_argument("--kinds", type=parse_name_list, default=["dspark", "dflash"],
                   help="drafter kinds (default: dspark,dflash)")  # fmt: skip
    p.add_argument("--layers", type=parse_int_list, default=[1, 2, 3], help="depths (default: 1,2,3)")
    option(p, "--study-dir", str(study_dir), "where the study checkpoints are")
    cli.add_gamma(p)
    add_study_options(p, prompts_per_domain=16)

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
    option(p, "--responses", str(paths.dspark_home() / "responses.jsonl"), "responses file")
    option(p, "--features-dir", str(paths.dspark_home() / "features"), "where feature caches live")
    cli.add_target(p)
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
           choices=profiler.PROFILE_NAMES)  # fmt: skip
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
    paths.write_text_atomic(where, text)
    print(f"\nwrote {where}")


if __name__ == "__main__":
    sys.exit(run_main(main))
