"""`bench ar | training | profile | serve | simulate | kernels | gpu`: how fast things run here.

Plain decoding speed, drafter training throughput, the SPS(B) profile and drafting cost the cost-aware
policies read, the serving frontier of the real engine (Fig. 7) and its GPU replay, the Triton kernels, and
the one-shot GPU report. Like dspark/lab/benchmarks/paper.py: parsed options in, a printed table and the JSON
record out; the measurements live in dspark/lab/study/.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

import torch

import dspark_kernels as kernels
from dspark.device import model_device
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.lab import cli, profiles, storage
from dspark.lab.benchmarks.common import load_model, report_points, write_outputs
from dspark.lab.cli import UsageError
from dspark.lab.cpu_speed import fast_on_cpu
from dspark.lab.data.corpus import DOMAINS, EVAL_PER_DOMAIN
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.machine import cpu_description
from dspark.lab.step_cost import engine_draft_cost
from dspark.lab.study import gpu, offline, pareto, plots, tables
from dspark.lab.study import kernels as kernel_study
from dspark.lab.training.drafters import new_drafter
from dspark.sampling import SamplingParams


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


def bench_training(args: argparse.Namespace) -> dict:
    """Time drafter training steps on the regenerated responses under several settings: features from a live
    target pass (as before the feature cache) or from the cache, anchors per sequence, fp32 or bf16. Prints
    seconds per step, anchors (blocks) per second and supervised (anchor, position) pairs per second, and the
    speed-up over the first setting of each drafter. Builds the feature cache first if it is missing.
    """
    from dspark.lab.study.training_speed import training_speed_table
    from dspark.lab.training.drafters import DrafterTrainConfig
    from dspark.lab.training.feature_cache import LiveFeatures, response_caches
    from dspark.lab.training.responses import load_responses

    _, target = load_model(args)
    responses, features_dir = storage.training_data(args.target_name, args.responses, args.features_dir)
    cache, _ = response_caches(target, responses, features_dir)
    sources = {"cache": cache, "live": LiveFeatures(target, load_responses(Path(responses), "train"))}
    rows = []
    for kind in args.drafters:

        def make(kind=kind):  # the drafter `train drafter` builds with the same options
            torch.manual_seed(0)
            drafter = new_drafter(target, kind, layers=args.layers, rank=args.rank, draft_vocab=args.draft_vocab,
                                  qk_norm=kind in PARALLEL_KINDS)  # fmt: skip
            return fast_on_cpu(drafter)

        settings = [dict(zip(("features", "anchors", "bf16"), s)) for s in args.settings]
        if kind not in PARALLEL_KINDS:  # every chain is supervised: the anchor density does not apply
            settings = [dict(t) for t in dict.fromkeys(tuple({**s, "anchors": 0}.items()) for s in settings)]
        tc = DrafterTrainConfig(batch_size=args.batch_size)
        measured = training_speed_table(make, target, sources, settings, tc, args.steps)
        for row in measured:
            row.update(drafter=kind, layers=args.layers or "default", rank=args.rank,
                       speedup=row["anchors_per_s"] / measured[0]["anchors_per_s"])  # fmt: skip
            print(f"{kind}: {row['features']}, anchors {row['anchors'] or 'all'}, {'bf16' if row['bf16'] else 'fp32'}: "
                  f"{row['seconds_per_step']:.2f} s/step, {row['anchors_per_s']:.0f} anchors/s")  # fmt: skip
        rows += measured
    table = tables.training_speed_table(rows)
    print(f"\ndrafter training speed, batch {args.batch_size} sequences, median of {args.steps} steps, "
          f"layers {args.layers or 'default'}, rank {'default' if args.rank is None else args.rank}, target "
          f"{args.target_name}, on {cpu_description()}:\n\n{table}")  # fmt: skip
    write_outputs(
        args, "training_speed", table, lambda out: plots.plot_training_speed(rows, out / "training_speed.png")
    )
    return {"benchmark": "training", "batch_size": args.batch_size, "steps": args.steps, "target": args.target_name,
            "machine": cpu_description(), "rows": rows}  # fmt: skip


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


def machine_name(device: torch.device) -> str:
    """What a result file says measured it: this CPU's description, or the GPU's name."""
    return cpu_description() if device.type == "cpu" else gpu.device_name(device)


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
    shown = [measured, profiles.named_profile("h200"), profiles.named_profile("h200-buckets")]
    points = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    print(f"SPS(B): target passes per second at B batch tokens (first: {args.target_name} measured here on --device "
          "and cached; h200: roofline model of an 8B bf16 model)\n")  # fmt: skip
    print("| B | " + " | ".join(p.name for p in shown) + " |\n|---:|" + "---:|" * len(shown))
    for b in points:
        cells = [f"{p.sps(b):.1f}" if b <= p.max_tokens else "-" for p in shown]
        print(f"| {b} | " + " | ".join(cells) + " |")
    costs = {}
    for name, drafter in drafters.items():
        gamma = drafter.max_gamma
        cost = engine_draft_cost(target, drafter, gamma, refresh=args.refresh)
        costs[name] = {"gamma": gamma, **asdict(cost)}  # all of it: `measured_profile_file` reads it back
        sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= len(cost.seconds_by_requests)]
        print(f"\ndrafting cost of {name} (γ = {gamma}), ms per drafting pass at n drafting requests: "
              + ", ".join(f"n = {n}: {1e3 * cost.seconds(n):.1f}" for n in sizes))  # fmt: skip
    if args.out:  # a figure only
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plots.plot_profiles(shown, Path(args.out) / "sps_profiles.png", max_tokens=512)
        print(f"\nwrote {Path(args.out) / 'sps_profiles.png'}")
    machine = machine_name(model_device(target))
    return {"benchmark": "profile", "target": args.target_name, "machine": machine, "threads": torch.get_num_threads(),
            "draft_costs": costs,
            "profiles": [{"name": p.name, "steps_per_second": p.steps_per_second} for p in shown]}  # fmt: skip


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
    machine = machine_name(device)
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
    profile = profiles.named_profile(args.profile, target)
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
            "tests/kernels/test_kernel_*.py) but not speed. Add --interpret to run this benchmark's agreement checks "
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
