"""`python -m dspark.bench`: benchmarks that print tables (and JSON on request).

  ar         plain autoregressive decoding speed of the target at several batch sizes
  offline    speculative decoding per drafter, domain and temperature: tau,
             position-wise acceptance, single-stream tokens/s and speed-up over
             no drafter (paper Table 1 and Fig. 2 analogues)
  depth      tau against the number of drafter layers, DSpark vs DFlash (Fig. 3)
  gamma      tau against the verified block length, and per-round latency with
             and without the sequential head (Fig. 4)
  threshold  static confidence-threshold sweep over fully verified rounds (Fig. 5)
  calibration  ECE/AUROC/Brier of the prefix survival before/after STS (Fig. 6)
  appendix-a   the selection-bias counterexample through the real schedulers
  profile      SPS(B) measured here (cached) and modelled for an H200
  serve        throughput vs tokens/s per user of the real engine, per policy
  simulate     the same frontier on a GPU profile, replaying recorded rounds

The offline-study commands write markdown tables and PNG figures with --out DIR
(the README's copies live in walkthrough/results/).

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
from dspark.data.corpus import EVAL_PER_DOMAIN, eval_prompts_by_domain
from dspark.data.tokenizer import Tokenizer
from dspark.generation import generate
from dspark.sampling import SamplingParams
from dspark.study import offline, plots


def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def parse_name_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def add_study_options(p: argparse.ArgumentParser, prompts_per_domain: int) -> None:
    """Options shared by the offline-study benchmarks."""
    p.add_argument("--prompts-per-domain", type=int, default=prompts_per_domain,
                   help="held-out prompts per domain (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens per request (default: %(default)s)")
    p.add_argument(
        "--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target weights (default: shipped)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--out", metavar="DIR", help="write the markdown table(s) and PNG figure(s) into DIR")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")


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
    from dspark.serving.rounds import RoundStats
    from dspark.serving.speculative import speculative_generate

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    drafters = {name: get_drafter(name, target) for name in args.drafters}
    by_domain = offline.prompts_by_domain(tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len)
    rows = []
    for temperature in args.temperatures:
        params = SamplingParams(temperature=temperature)
        for domain, prompts in by_domain.items():
            generate(target, prompts[:1], 4, params)  # warm-up
            base_tokens = base_time = 0.0
            for i, prompt in enumerate(prompts):  # single stream: one request at a time
                r = generate(target, [prompt], args.max_new_tokens, params, torch.Generator().manual_seed(i),
                             tokenizer.eos_id)  # fmt: skip
                base_tokens += r.new_tokens
                base_time += r.prefill_seconds + r.decode_seconds
            base_tps = base_tokens / base_time
            rows.append({"drafter": "none", "domain": domain, "temperature": temperature, "gamma": 0,
                         "tau": 1.0, "cond_acceptance": [], "tokens_per_s": base_tps, "speedup": 1.0})  # fmt: skip
            for name, drafter in drafters.items():
                gamma = min(args.gamma, drafter.max_gamma)
                n_tokens = seconds = 0.0
                stats = RoundStats()
                for i, prompt in enumerate(prompts):
                    r = speculative_generate(target, drafter, [prompt], args.max_new_tokens, params, gamma,
                                             torch.Generator().manual_seed(i), tokenizer.eos_id)  # fmt: skip
                    n_tokens += r.new_tokens
                    seconds += r.prefill_seconds + r.decode_seconds
                    stats.extend(r.stats)
                tps = n_tokens / seconds
                rows.append({"drafter": name, "domain": domain, "temperature": temperature, "gamma": gamma,
                             "tau": stats.tau, "cond_acceptance": stats.acceptance_by_position(gamma),
                             "tokens_per_s": tps, "speedup": tps / base_tps})  # fmt: skip
    print(f"offline speculative decoding, gamma = {args.gamma}, {args.prompts_per_domain} held-out prompts per "
          f"domain, batch 1, {torch.get_num_threads()} CPU threads\n")  # fmt: skip
    print("| T | drafter | domain | tau | tokens/s | speed-up | conditional acceptance by position |")
    print("|---|---|---|---:|---:|---:|---|")
    for r in rows:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["cond_acceptance"])
        print(f"| {r['temperature']:g} | {r['drafter']} | {r['domain']} | {r['tau']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{r['speedup']:.2f}x | {acc} |")  # fmt: skip
    table = offline_table(rows)
    print("\nTable 1 analogue: tau (tokens per round incl. the bonus token)\n\n" + table)

    def plot(out: Path) -> None:
        for temperature in args.temperatures:
            sub = [r for r in rows if r["temperature"] == temperature]
            plots.plot_position_acceptance(sub, out / f"position_acceptance_T{temperature:g}.png",
                                           f"conditional acceptance by position, T = {temperature:g}")  # fmt: skip

    write_outputs(args, "table1", table, plot)
    return {"benchmark": "offline", "gamma": args.gamma, "results": rows}


def offline_table(rows: list[dict]) -> str:
    """Markdown: one row per drafter, tau per domain and macro average, per temperature, + speed-up."""
    temps = list(dict.fromkeys(r["temperature"] for r in rows))
    domains = list(dict.fromkeys(r["domain"] for r in rows))
    header = ["drafter"]
    for t in temps:
        header += [f"{d} T={t:g}" for d in domains] + [f"macro T={t:g}", f"speed-up T={t:g}"]
    body = []
    for name in dict.fromkeys(r["drafter"] for r in rows if r["drafter"] != "none"):
        line: list = [name]
        for t in temps:
            sub = {r["domain"]: r for r in rows if r["drafter"] == name and r["temperature"] == t}
            line += [sub[d]["tau"] for d in domains] + [offline.macro([sub[d]["tau"] for d in domains])]
            line.append(", ".join(f"{sub[d]['speedup']:.2f}x" for d in domains))
        body.append(line)
    return offline.markdown_table(header, body)


def write_outputs(args: argparse.Namespace, stem: str, table: str, plot) -> None:
    """With --out DIR: DIR/<stem>.md holds `table`; `plot(DIR)` draws the figure(s) there."""
    if not args.out:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(table)
    plot(out)
    print(f"wrote {out / stem}.md and its figure(s)")


def load_study_drafters(target, specs: list[str]) -> dict:
    """`label=PATH` pairs (or a bare shipped drafter name) -> {label: drafter}."""
    from dspark.drafters.registry import get_drafter, load_drafter

    out = {}
    for spec in specs:
        label, _, path = spec.partition("=")
        if path:
            if not Path(path).is_file():
                raise UsageError(
                    f"no drafter checkpoint at {path} (train it with `python -m dspark.train drafter`)"
                )
            out[label] = load_drafter(path, target)
        else:
            out[label] = get_drafter(label, target)
    return out


def bench_depth(args: argparse.Namespace) -> dict:
    from dspark.drafters.registry import load_drafter

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    params = SamplingParams(temperature=args.temperature)
    prompts = offline.prompts_by_domain(tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len)
    rows = []
    for kind in args.kinds:
        for layers in args.layers:
            path = Path(args.study_dir) / f"{kind}_L{layers}.safetensors"
            if not path.is_file():
                raise UsageError(f"missing {path}: train it with `python -m dspark.train drafter --kind {kind} "
                                 f"--layers {layers} --steps 800 --out {path}`")  # fmt: skip
            drafter = load_drafter(path, target)
            for domain, ps in prompts.items():
                rounds = offline.measure_tau(target, drafter, ps, params, args.gamma, args.max_new_tokens,
                                           tokenizer.eos_id)  # fmt: skip
                rows.append({"kind": kind, "layers": layers, "domain": domain, "tau": rounds.tau})
            tau = [r["tau"] for r in rows[-len(prompts) :]]
            rows.append({"kind": kind, "layers": layers, "domain": "macro", "tau": offline.macro(tau)})
    domains = [*prompts, "macro"]
    body = [[k, n, *(next(r["tau"] for r in rows if (r["kind"], r["layers"], r["domain"]) == (k, n, d))
                     for d in domains)] for k in args.kinds for n in args.layers]  # fmt: skip
    table = offline.markdown_table(["drafter", "layers", *domains], body)
    print(f"drafter depth, gamma = {args.gamma}, T = {args.temperature:g}, tau\n\n" + table)
    write_outputs(args, "depth", table, lambda out: plots.plot_depth(rows, out / "depth.png"))
    return {"benchmark": "depth", "gamma": args.gamma, "temperature": args.temperature, "results": rows}


def bench_gamma(args: argparse.Namespace) -> dict:
    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    params = SamplingParams(temperature=args.temperature)
    prompts = offline.prompts_by_domain(tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len)
    drafters = load_study_drafters(target, args.drafters)
    tau_rows, latency_rows = [], []
    for label, drafter in drafters.items():
        if drafter.name not in ("dflash", "dspark", "dspark-rnn"):
            raise UsageError(
                f"{label}: the gamma study compares the parallel drafters (dflash, dspark, dspark-rnn)"
            )
        if max(args.gammas) > drafter.max_gamma:
            raise UsageError(f"drafter {label} drafts at most {drafter.max_gamma} tokens; lower --gammas")
        for domain, ps in prompts.items():
            for gamma in args.gammas:  # the drafter proposes its full block; only the first γ are verified
                rounds = offline.measure_tau(target, drafter, ps, params, drafter.max_gamma, args.max_new_tokens,
                                           tokenizer.eos_id, verify_len=gamma)  # fmt: skip
                tau_rows.append({"kind": label, "domain": domain, "gamma": gamma, "tau": rounds.tau})
        batch = [p for ps in prompts.values() for p in ps][: args.latency_batch]
        for gamma in args.gammas:
            row = offline.round_latency(target, drafter, batch, gamma, params, args.repeats)
            latency_rows.append({"kind": label, **row})
    domains = list(prompts)
    header = ["drafter", "γ", *domains, "macro", f"round ms (batch {args.latency_batch})", "draft ms"]
    body = []
    for label in drafters:
        for gamma in args.gammas:
            tau = [next(r["tau"] for r in tau_rows if (r["kind"], r["domain"], r["gamma"]) == (label, d, gamma))
                   for d in domains]  # fmt: skip
            lat = next(r for r in latency_rows if (r["kind"], r["gamma"]) == (label, gamma))
            body.append([label, gamma, *tau, offline.macro(tau), lat["round_ms"], lat["draft_ms"]])
    table = offline.markdown_table(header, body)
    print(f"proposal length, T = {args.temperature:g}: tau and per-round latency\n\n" + table)
    write_outputs(
        args, "gamma", table, lambda out: plots.plot_gamma(tau_rows, latency_rows, out / "gamma.png")
    )
    return {"benchmark": "gamma", "temperature": args.temperature, "tau": tau_rows, "latency": latency_rows}


def bench_threshold(args: argparse.Namespace) -> dict:
    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    params = SamplingParams(temperature=args.temperature)
    ((label, drafter),) = load_study_drafters(target, [args.drafter]).items()
    gamma = min(args.gamma, drafter.max_gamma)
    rows = []
    for domain, ps in offline.prompts_by_domain(
        tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len
    ).items():
        rounds = offline.measure_tau(
            target, drafter, ps, params, gamma, args.max_new_tokens, tokenizer.eos_id
        )
        for row in offline.threshold_sweep(rounds, args.thresholds):
            rows.append({"domain": domain, **row})
    body = [[r["domain"], r["threshold"], r["accepted_per_step"], r["rejected_per_step"],
             None if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.1f}%"] for r in rows]  # fmt: skip
    table = offline.markdown_table(
        ["domain", "θ", "accepted drafts / step", "rejected drafts / step", "acceptance rate"], body
    )
    print(f"static survival-threshold sweep, {label}, gamma = {gamma}, T = {args.temperature:g}\n\n" + table)
    write_outputs(args, "threshold", table, lambda out: plots.plot_threshold(rows, out / "threshold.png"))
    return {"benchmark": "threshold", "drafter": label, "gamma": gamma, "results": rows}


def bench_calibration(args: argparse.Namespace) -> dict:
    from dspark.drafters.registry import default_path, get_drafter, load_calibration
    from dspark.scheduling import calibration
    from dspark.serving.rounds import RoundStats

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    path = Path(args.drafter_checkpoint) if args.drafter_checkpoint else default_path(args.drafter)
    drafter = get_drafter(args.drafter, target, path)
    temperatures = load_calibration(path)
    if temperatures is None:
        raise UsageError(
            f"{path} is not calibrated yet: run `python -m dspark.train calibrate --drafter {args.drafter}`"
        )
    if args.prompts_per_domain > calibration.FIT_PROMPTS[0]:
        raise UsageError(
            f"--prompts-per-domain must be <= {calibration.FIT_PROMPTS[0]} (later prompts fit STS)"
        )
    params = SamplingParams(args.temperature)
    gamma = min(args.gamma, drafter.max_gamma)
    rounds = RoundStats()
    for prompts in offline.prompts_by_domain(
        tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len
    ).values():
        rounds.extend(
            offline.measure_tau(
                target, drafter, prompts, params, gamma, args.max_new_tokens, tokenizer.eos_id
            )
        )
    conf, events, mask = rounds.calibration_arrays()
    rows = calibration.position_metrics(conf, events, mask, temperatures)
    body = [[r["k"], r["rounds"], r["survival_rate"], f"{100 * r['ece_before']:.1f}%", f"{100 * r['ece_after']:.1f}%",
             f"{100 * r['ece_noise_floor']:.1f}%", None if r["auroc"] is None else f"{r['auroc']:.3f}",
             f"{r['brier']:.3f}"] for r in rows]  # fmt: skip
    table = offline.markdown_table(["k", "rounds", "observed survival", "ECE before", "ECE after STS",
                                  "ECE noise floor", "AUROC", "Brier"], body)  # fmt: skip
    print(f"calibration of {args.drafter} on held-out rounds (eval prompts 0..{args.prompts_per_domain - 1} per "
          f"domain, T = {args.temperature:g}, gamma = {gamma}), STS temperatures "
          f"{' '.join(f'{t:.2f}' for t in temperatures.tolist())}\n\n" + table)  # fmt: skip
    title = f"{args.drafter}: prefix survival, before (raw) and after STS"
    write_outputs(args, "calibration", table, lambda out: plots.plot_reliability(
        conf, events, mask, temperatures, out / "reliability.png", title))  # fmt: skip
    keys = ("k", "ece_before", "ece_after", "auroc", "brier", "rounds", "survival_rate", "ece_noise_floor")
    return {"benchmark": "calibration", "drafter": args.drafter, "rounds": int(conf.shape[0]),
            "sts_temperatures": temperatures.tolist(),
            "positions": [{k: r[k] for k in keys} for r in rows]}  # fmt: skip


def bench_appendix_a(args: argparse.Namespace) -> dict:
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


def bench_profile(args: argparse.Namespace) -> dict:
    from dspark.scheduling import profiler

    target, _ = load_target(args.checkpoint)
    cpu = profiler.cpu_profile(target, refresh=args.refresh)
    profiles = [cpu, profiler.named_profile("h200"), profiler.named_profile("h200-buckets")]
    points = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    print("SPS(B): target passes per second at B batch tokens (cpu: measured here and cached; h200: roofline "
          "model of an 8B bf16 model)\n")  # fmt: skip
    print("| B | " + " | ".join(p.name for p in profiles) + " |\n|---:|" + "---:|" * len(profiles))
    for b in points:
        cells = [f"{p.sps(b):.1f}" if b <= p.max_tokens else "-" for p in profiles]
        print(f"| {b} | " + " | ".join(cells) + " |")
    if args.out:  # a figure only
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plots.plot_profiles(profiles, Path(args.out) / "sps_profiles.png", max_tokens=512)
        print(f"\nwrote {Path(args.out) / 'sps_profiles.png'}")
    return {"benchmark": "profile", "profiles": [{"name": p.name, "steps_per_second": p.steps_per_second}
                                                  for p in profiles]}  # fmt: skip


def report_points(points: list[dict], args: argparse.Namespace, title: str, stem: str) -> None:
    from dspark.study import pareto

    header = ["policy", "drafter", "C", "throughput tok/s", "tok/s per user", "TPOT ms", "mean ℓ", "τ"]
    body = [[p["policy"], p["drafter"], p["concurrency"], p["throughput"], p["tps_per_user"], p["tpot_ms"],
             p["mean_verify_len"], p["tau"]] for p in points]  # fmt: skip
    table = offline.markdown_table(header, body)
    matched = ""
    for policy in dict.fromkeys(p["policy"] for p in points):
        if policy in ("mtp1", "none") or "mtp1" not in args.policies:
            continue
        for row in pareto.at_matched_throughput(points, policy):
            matched += (f"| {policy} | {row['throughput']:.1f} | {row['baseline_tps_per_user']:.2f} | "
                        f"{row['tps_per_user']:.2f} | {100 * row['gain']:+.0f}% |\n")  # fmt: skip
    if matched:
        matched = ("\nat matched throughput (MTP-1's points, the policy's frontier interpolated):\n\n"
                   "| policy | throughput | MTP-1 tok/s/user | tok/s/user | gain |\n|---|---:|---:|---:|---:|\n"
                   + matched)  # fmt: skip
    print(f"{title}\n\n{table}{matched}")

    def plot(out: Path) -> None:
        plots.plot_frontier(points, out / f"{stem}_frontier.png", title)
        plots.plot_load(points, out / f"{stem}_load.png", title)

    write_outputs(args, stem, table + matched, plot)


def bench_serve(args: argparse.Namespace) -> dict:
    from dspark.scheduling import profiler
    from dspark.study import pareto

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    profile = profiler.cpu_profile(target)
    params = SamplingParams(args.temperature)
    points = pareto.serve_points(target, tokenizer, args.policies, args.concurrency, args.requests,
                                 args.max_new_tokens, profile, params, arrival_rate=args.poisson)  # fmt: skip
    mode = f"Poisson arrivals at {args.poisson:g}/s" if args.poisson else "closed loop"
    title = (f"measured on this CPU ({torch.get_num_threads()} threads, {mode}): {args.requests} requests of up "
             f"to {args.max_new_tokens} tokens, T = {args.temperature:g}")  # fmt: skip
    report_points(points, args, title, "serve")
    return {"benchmark": "serve", "points": points}


def bench_simulate(args: argparse.Namespace) -> dict:
    from dspark.scheduling import profiler
    from dspark.study import pareto

    tokenizer = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(args.checkpoint)
    profile = profiler.named_profile(args.profile, target)
    params = SamplingParams(args.temperature)
    traces = {}
    for name in {pareto.drafter_for(p)[0] for p in args.policies} | {"dspark"}:
        if name != "none":
            gamma = pareto.drafter_for("mtp1" if name == "mtp" else "dspark")[1]
            traces[name] = pareto.record_traces(target, tokenizer, name, gamma, params, refresh=args.refresh)
    points = pareto.simulate_points(traces, args.policies, args.concurrency, args.requests, profile)
    title = f"simulated on the {profile.name} profile: traces of the real drafters, T = {args.temperature:g}"
    report_points(points, args, title, f"simulate_{args.profile}")
    return {"benchmark": "simulate", "profile": args.profile, "points": points}


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
        help="Table 1 + Fig. 2: tau, acceptance by position and speed-up per drafter and domain",
        description="Speculative decoding on the held-out prompts, one request at a time: per drafter, "
        "domain and temperature, tau (tokens per round incl. the bonus), position-wise conditional "
        "acceptance, tokens/s and the speed-up over plain decoding on this machine. With --out: "
        "table1.md and position_acceptance_T<t>.png (paper Table 1 and Fig. 2 analogues).",
    )
    p.add_argument("--drafters", type=parse_name_list, default=["mtp", "eagle"],
                   help="comma-separated drafter names (default: mtp,eagle)")  # fmt: skip
    p.add_argument("--temperatures", type=parse_float_list, default=[1.0],
                   help="comma-separated sampling temperatures (default: 1)")  # fmt: skip
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    add_study_options(p, prompts_per_domain=8)
    p.set_defaults(func=bench_offline)

    p = sub.add_parser(
        "depth",
        help="Fig. 3: tau against drafter layers",
        description="tau per domain of drafters trained with 1, 2, ... backbone layers, read from "
        "STUDY_DIR/<kind>_L<layers>.safetensors (train them with `python -m dspark.train drafter "
        "--layers N --out ...`). With --out: depth.md and depth.png (paper Fig. 3 analogue).",
    )
    p.add_argument("--kinds", type=parse_name_list, default=["dspark", "dflash"],
                   help="drafter kinds (default: dspark,dflash)")  # fmt: skip
    p.add_argument("--layers", type=parse_int_list, default=[1, 2, 3], help="depths (default: 1,2,3)")
    p.add_argument("--study-dir", default=str(paths.runs_dir() / "study"),
                   help="where the study checkpoints are (default: %(default)s)")  # fmt: skip
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    add_study_options(p, prompts_per_domain=16)
    p.set_defaults(func=bench_depth)

    p = sub.add_parser(
        "gamma",
        help="Fig. 4: tau against gamma, and round latency with/without the sequential head",
        description="For drafters trained with a long block (default: the γ=16 study checkpoints), tau "
        "per domain when only the first γ drafts of each block are verified, and the median wall-clock "
        "of one round (drafting γ tokens + the target pass over anchor + γ drafts) at --latency-batch "
        "requests. dflash is the same backbone without the sequential head. With --out: gamma.md and "
        "gamma.png (paper Fig. 4 analogue).",
    )
    study_dir = paths.runs_dir() / "study"
    p.add_argument("--drafters", type=parse_name_list,
                   default=[f"{k}={study_dir / (k + '_g16.safetensors')}" for k in ("dspark", "dflash")],
                   help="comma-separated LABEL=CHECKPOINT (or shipped names) (default: dspark,dflash at γ=16 "
                   "in the study dir)")  # fmt: skip
    p.add_argument("--gammas", type=parse_int_list, default=[4, 8, 12, 16], help="(default: 4,8,12,16)")
    p.add_argument("--latency-batch", type=int, default=16, help="requests per timed round (default: 16)")
    p.add_argument("--repeats", type=int, default=20, help="timed rounds per point (default: 20)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    add_study_options(p, prompts_per_domain=16)
    p.set_defaults(func=bench_gamma)

    p = sub.add_parser(
        "threshold",
        help="Fig. 5: static confidence-threshold sweep",
        description="Fully verified rounds of a DSpark drafter on the held-out prompts, replayed under "
        "static thresholds on the prefix survival Π c_j: accepted and rejected draft tokens per step and "
        "the acceptance rate. With --out: threshold.md and threshold.png (paper Fig. 5 analogue).",
    )
    p.add_argument("--drafter", default="dspark", help="name or LABEL=CHECKPOINT (default: dspark)")
    p.add_argument("--thresholds", type=parse_float_list, default=[round(0.1 * i, 1) for i in range(10)],
                   help="comma-separated survival thresholds (default: 0,0.1,...,0.9)")  # fmt: skip
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    add_study_options(p, prompts_per_domain=16)
    p.set_defaults(func=bench_threshold)

    p = sub.add_parser(
        "calibration",
        help="ECE / AUROC / Brier of the prefix survival before and after STS",
        description="Decode held-out eval prompts (0..N-1 per domain; STS was fitted on 40..79) with full "
        "verification and score the prefix survival of every position against 'drafts 1..k accepted': "
        "ECE before and after Sequential Temperature Scaling, AUROC, Brier. With --out: calibration.md and "
        "reliability.png (paper Fig. 6 analogue). Run `python -m dspark.train calibrate` first.",
    )
    p.add_argument("--drafter", default="dspark", choices=("dflash", "dspark", "dspark-rnn"),
                   help="drafter name (default: %(default)s)")  # fmt: skip
    p.add_argument("--drafter-checkpoint", help="drafter weights (default: the shipped one)")
    p.add_argument("--gamma", type=int, default=7, help="draft tokens per round (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
    add_study_options(p, prompts_per_domain=40)
    p.set_defaults(func=bench_calibration)

    p = sub.add_parser(
        "appendix-a",
        help="the paper's selection-bias counterexample, measured",
        description="Paper Appendix A: one request, gamma 2, target (0.7, 0.3), draft (0.5, 0.5), a Markov "
        "confidence that depends on the first draft, SPS(1..3) = 1, 0.5, 0.45. Prints the first-token law "
        "under the retrospective scheduler (lossy: about (0.85, 0.15)), Algorithm 1 with the early stop "
        "and the asynchronous variant (both (0.7, 0.3)).",
    )
    p.add_argument("--draws", type=int, default=100_000, help="independent rounds (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(func=bench_appendix_a)

    p = sub.add_parser(
        "profile",
        help="the SPS(B) throughput profiles the scheduler uses",
        description="Measure (once, then cached under DSPARK_HOME) how many target passes per second this "
        "machine does at B batch tokens, and print it next to the H200 roofline models (smooth, and with "
        "CUDA-graph buckets). With --out: sps_profiles.png.",
    )
    p.add_argument("--refresh", action="store_true", help="measure again instead of using the cache")
    p.add_argument(
        "--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target weights (default: shipped)"
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--out", metavar="DIR", help="write sps_profiles.png into DIR")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.set_defaults(func=bench_profile)

    from dspark.scheduling.profiler import PROFILE_NAMES
    from dspark.scheduling.scheduler import POLICY_NAMES

    def policy_list(text: str) -> list[str]:
        names = parse_name_list(text)
        bad = [n for n in names if n not in POLICY_NAMES]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown policy {bad[0]!r}; choose from {', '.join(POLICY_NAMES)}"
            )
        return names

    for name, func, help_text, description, concurrency, requests in (
        ("serve", bench_serve, "throughput vs tokens/s per user of the real engine on this CPU",
         "Closed-loop serving with the real engine at each concurrency: every policy (none: plain decoding; "
         "mtp1: the MTP-1 drafter; the others: the DSpark drafter with its confidences and this machine's "
         "measured SPS profile). With --out: serve.md, serve_frontier.png, serve_load.png.",
         [1, 2, 4, 8, 16], 48),
        ("simulate", bench_simulate, "the same frontier simulated on a GPU profile from recorded traces",
         "Trace-driven simulation: rounds recorded from the real drafters on held-out prompts (cached under "
         "DSPARK_HOME) replayed through each policy and a GPU SPS profile (h200: roofline, h200-buckets: with "
         "CUDA-graph padding). With --out: simulate_<profile>.md and the frontier / load PNGs.",
         [1, 2, 4, 8, 16, 32, 64, 128, 256], 2000),
    ):  # fmt: skip
        p = sub.add_parser(name, help=help_text, description=description)
        p.add_argument("--policy", "--policies", dest="policies", type=policy_list,
                       default=["none", "mtp1", "fixed", "goodput", "dspark", "dspark-async"],
                       help="comma-separated policies (default: none,mtp1,fixed,goodput,dspark,dspark-async)")  # fmt: skip
        p.add_argument("--concurrency", type=parse_int_list, default=concurrency,
                       help=f"comma-separated concurrencies (default: {','.join(map(str, concurrency))})")  # fmt: skip
        p.add_argument(
            "--requests", type=int, default=requests, help="requests per point (default: %(default)s)"
        )
        p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1)")
        p.add_argument(
            "--checkpoint", default=str(paths.TARGET_CHECKPOINT), help="target weights (default: shipped)"
        )
        p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
        p.add_argument("--out", metavar="DIR", help="write the table and the PNG figures into DIR")
        p.add_argument("--json", metavar="PATH", help="also write the points as JSON to PATH")
        if name == "serve":
            p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request (default: 64)")
            p.add_argument("--poisson", type=float, metavar="RATE",
                           help="requests arrive as a Poisson process at RATE per second (default: closed loop)")  # fmt: skip
        else:
            p.add_argument("--profile", choices=[n for n in PROFILE_NAMES], default="h200",
                           help="SPS profile (default: %(default)s)")  # fmt: skip
            p.add_argument("--refresh", action="store_true", help="record the drafter traces again")
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if getattr(args, "max_new_tokens", 1) < 1 or getattr(args, "repeats", 1) < 1:
        raise UsageError("--max-new-tokens and --repeats must be at least 1")
    if getattr(args, "requests", 1) < 1:
        raise UsageError("--requests must be at least 1")
    if getattr(args, "poisson", None) is not None and not args.poisson > 0:
        raise UsageError("--poisson needs a positive arrival rate")
    if not 1 <= getattr(args, "prompts_per_domain", 1) <= EVAL_PER_DOMAIN:
        raise UsageError(f"--prompts-per-domain must be in 1..{EVAL_PER_DOMAIN}")
    result = args.func(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    sys.exit(run_main(main))
