"""`bench offline | ratios | depth | budget | gamma | threshold | calibration | appendix-a`: the paper's quality claims.

Each function parses nothing: it takes the parsed options (dspark/lab/commands/bench.py builds them), calls
the measurement in dspark/lab/study/ (offline.py, tables.py, plots.py, ...), prints its table and returns the
JSON record. Table 1 and Fig. 2 (offline), Fig. 3 (depth), the budget curve, Fig. 4 (gamma), Fig. 5 (threshold), Fig. 6
(calibration), Appendix A.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspark.drafters import default_path
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.lab import calibration, cli
from dspark.lab.benchmarks.common import dtype_name, load_model, policy_for, study_prompts, write_outputs
from dspark.lab.calibration import find_calibration, get_calibration
from dspark.lab.cli import UsageError
from dspark.lab.cost_aware.scheduler import CostAwareScheduler
from dspark.lab.exporting import exported
from dspark.lab.machine import cpu_description
from dspark.lab.pretrained.prompt_sets import prompts_label
from dspark.lab.study import gpu, offline, plots, tables, tau_intervals
from dspark.lab.study.offline import labelled_specs
from dspark.sampling import SamplingParams
from dspark.scheduler import temperatures_and_offsets


def bench_offline(args: argparse.Namespace) -> dict:
    """Speculative decoding on the held-out prompts, one request at a time: per drafter, domain and temperature,
    tau (tokens per round incl. the bonus), position-wise conditional acceptance, tokens/s and the speed-up
    over plain decoding on this machine, and every pair's macro-tau ratio with a 95% paired bootstrap interval
    (prompts resampled). --tau-only skips the clock and plain decoding and runs --batch-size prompts at a time.
    With --out: table1.md and position_acceptance_T<t>.png (paper Table 1 and Fig. 2 analogues). With --policy
    the drafters run `generate --policy`'s scheduler, so the speed-up is that of `python -m dspark.generate
    --drafter NAME --policy P` against `--drafter none`.
    """
    args.policy = args.policy or ("fixed" if args.tau_only else "dspark")  # generate's default where timed
    tokenizer, target = load_model(args)
    by_domain = study_prompts(args, tokenizer, target)  # a bad --prompts file fails before the drafters load
    counts = {domain: len(prompts) for domain, prompts in by_domain.items()}  # a file may hold fewer
    drafters = offline.load_labelled_drafters(target, args.drafters, args.target_name)
    gammas = {
        name: cli.resolve_gamma(args.gamma, d, name, mtp_drafts_one=True) for name, d in drafters.items()
    }
    checkpoints = {label: path or None for label, path in labelled_specs(args.drafters)}
    policies = {name: policy_for(args.policy, d) for name, d in drafters.items()}

    def scheduler_for(name: str, drafter) -> CostAwareScheduler | None:
        """The scheduler `generate --policy` builds (fresh per request: it learns from its rounds)."""
        temperatures = get_calibration(name, checkpoints[name], args.target_name, drafter.max_gamma)
        return gpu.measured_scheduler(policies[name], drafter, target, gammas[name], temperatures,
                                      cost_aware=not args.ignore_draft_cost, requests=1)  # fmt: skip

    if args.tau_only:
        if args.policy != "fixed":
            raise UsageError("--tau-only verifies every draft: use it with --policy fixed (its default)")
        rows = offline.run_tau(target, drafters, by_domain, args.temperatures, gammas, args.max_new_tokens,
                               tokenizer.eos_id, args.batch_size)  # fmt: skip
    else:
        rows = offline.run_speedup(target, drafters, by_domain, args.temperatures, gammas, args.max_new_tokens,
                                   tokenizer.eos_id, scheduler_for)  # fmt: skip
    batch = f"tau only, batch {args.batch_size}" if args.tau_only else "batch 1"
    print(f"offline speculative decoding, gamma {', '.join(f'{n} {g}' for n, g in gammas.items())}, policy "
          f"{', '.join(f'{n} {p}' for n, p in policies.items())}, held-out prompts "
          f"{'of ' + prompts_label(args.prompts) + ' ' if args.prompts else ''}per domain: "
          f"{', '.join(f'{d} {n}' for d, n in counts.items())}, {batch}, {cpu_description()}, "
          f"{dtype_name(target)}\n")  # fmt: skip
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
            "prompts": prompts_label(args.prompts), "prompts_per_domain": args.prompts_per_domain,
            "prompts_measured": counts, "max_new_tokens": args.max_new_tokens, "machine": cpu_description(),
            "tau_only": args.tau_only, "results": rows, "macro_tau_ratios": ratios}  # fmt: skip


def read_record(path: str, option: str = "") -> dict:
    """An earlier benchmark's --json file, or a one-line UsageError naming it (`option`: the flag that gave it)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{option}{path}: not a readable JSON file ({err})") from None


def bench_ratios(args: argparse.Namespace) -> dict:
    """Macro-tau ratios with 95% paired intervals between the drafters of several `bench offline --json` runs
    on the same prompts, e.g. a drafter trained in a later session against drafters whose checkpoints are gone
    but whose JSON is committed. Prompts pair the runs as within one run (the sampling draws differ); a label
    that an earlier file already has becomes LABEL@N (N: the file's position), so a drafter measured in both
    runs is also compared with itself: its ratio, near 1, says how far two runs agree. Measures nothing.
    """
    records = [read_record(path) for path in args.runs]
    try:
        rows = tau_intervals.rows_of_runs(records)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.drafters:
        missing = [d for d in args.drafters if d not in {r["drafter"] for r in rows}]
        if missing:
            labels = ", ".join(dict.fromkeys(r["drafter"] for r in rows))
            raise UsageError(f"no drafter {', '.join(missing)} in these runs (they have: {labels})")
        rows = sorted(
            (r for r in rows if r["drafter"] in args.drafters),
            key=lambda r: args.drafters.index(r["drafter"]),
        )
    ratios = tau_intervals.ratio_rows(rows)
    sources = "\n".join(
        f"run {i}: {p} ({r.get('machine')})" for i, (p, r) in enumerate(zip(args.runs, records), 1)
    )
    table = tables.table1(rows) + "\n" + tables.ratio_table(ratios)
    print(f"macro-tau ratios across runs, held-out prompts {records[0].get('prompts')}\n{sources}\n\n{table}")
    write_outputs(args, "ratios", f"{sources}\n\n{table}", lambda out: None)
    return {
        "benchmark": "ratios",
        "runs": [str(p) for p in args.runs],
        "results": rows,
        "macro_tau_ratios": ratios,
    }


def bench_depth(args: argparse.Namespace) -> dict:
    """tau per domain of drafters trained with 1, 2, ... backbone layers, read from
    STUDY_DIR/<kind>_L<layers>.safetensors (train them with `python -m dspark.train drafter --layers N --out
    ...`), with each checkpoint's validation c*, size and drafting time per pass at --draft-batches requests.
    With --out: depth.md and depth.png (paper Fig. 3 analogue). --with adds the points of earlier runs' JSON
    (checkpoints trained in another session), each with the machine that timed its drafting.
    """
    points = args.points or [(kind, n) for kind in args.kinds for n in args.layers]
    earlier = earlier_depth_rows(args, set(points))  # a bad --with file fails before any measurement
    checkpoints = {(kind, n): Path(args.study_dir) / f"{kind}_L{n}.safetensors" for kind, n in points}
    for (kind, n), path in checkpoints.items():
        if not path.is_file():
            raise UsageError(f"missing {path}: train it with `python -m dspark.train drafter --kind {kind} "
                             f"--layers {n} --epochs 0.5 --out {path}`")  # fmt: skip
    tokenizer, target = load_model(args)
    rows = offline.run_depth(target, checkpoints, study_prompts(args, tokenizer, target),
                             SamplingParams(args.temperature), args.gamma, args.max_new_tokens, tokenizer.eos_id,
                             args.draft_batches)  # fmt: skip
    rows = [r | {"machine": cpu_description()} if r["domain"] == "macro" else r for r in rows] + earlier
    table = tables.depth_table(rows)
    gamma = args.gamma or "each drafter's own"
    print(f"drafter depth, gamma = {gamma}, T = {args.temperature:g}, tau; drafting ms on {cpu_description()}, "
          f"{dtype_name(target)}\n\n" + table)  # fmt: skip
    write_outputs(args, "depth", table, lambda out: plots.plot_depth(rows, out / "depth.png"))
    return {"benchmark": "depth", "gamma": args.gamma, "temperature": args.temperature,
            "prompts": prompts_label(args.prompts), "prompts_per_domain": args.prompts_per_domain,
            "machine": cpu_description(),
            "dtype": dtype_name(target), "results": rows}  # fmt: skip


def earlier_depth_rows(args: argparse.Namespace, measured: set[tuple[str, int]]) -> list[dict]:
    """The rows of the `bench depth --json` files of --with for the (kind, layers) points not measured now,
    a later file's point replacing an earlier one's; each macro row names the machine of its drafting ms.
    Refuses (UsageError) a file that is no depth record or measured other prompts, temperature or γ."""
    found: dict[tuple[str, int], list[dict]] = {}
    for path in args.earlier or []:
        record = read_record(path, "--with ")
        if record.get("benchmark") != "depth":
            raise UsageError(f"--with {path}: a `bench {record.get('benchmark')}` record, not `bench depth`")
        now = {"prompts": prompts_label(args.prompts), "temperature": args.temperature, "gamma": args.gamma,
               "prompts_per_domain": args.prompts_per_domain}  # fmt: skip
        for key, value in now.items():  # (a file written before prompts_per_domain was stored is trusted)
            if record.get(key, value) != value:
                raise UsageError(f"--with {path}: measured with {key} {record[key]!r}, this run {value!r}")
        of_file: dict[tuple[str, int], list[dict]] = {}
        for r in record["results"]:
            if r["domain"] == "macro":  # a point that a merge carried over keeps the machine that timed it
                r = r | {"machine": r.get("machine") or record.get("machine"),
                         "draft_ms": {int(n): ms for n, ms in r.get("draft_ms", {}).items()}}  # fmt: skip
            of_file.setdefault((r["kind"], r["layers"]), []).append(r)
        found |= {point: rows for point, rows in of_file.items() if point not in measured}
    return [r for rows in found.values() for r in rows]


def bench_budget(args: argparse.Namespace) -> dict:
    """tau per domain of each STUDY_DIR/<kind>_L<layers>.safetensors run at its --keep-at snapshots
    (<kind>_L<layers>.epochs-E.safetensors, E from --marks) and at its end: the budget curve of one run per
    drafter. With --out: budget.md and budget.png.
    """
    from dspark.lab.training.drafters import snapshot_path

    runs = {}
    for kind, n in args.points:
        final = Path(args.study_dir) / f"{kind}_L{n}.safetensors"
        runs[kind, n] = [snapshot_path(final, e) for e in args.marks] + [final]
        for path in runs[kind, n]:
            if not path.is_file():
                raise UsageError(f"missing {path}: train the run with `python -m dspark.train drafter --kind "
                                 f"{kind} --layers {n} --epochs E --keep-at {' '.join(f'{e:g}' for e in args.marks)} "
                                 f"--out {final}`")  # fmt: skip
    tokenizer, target = load_model(args)  # after the checks: a missing run costs no model load
    prompts = study_prompts(args, tokenizer, target)
    rows = []
    for (kind, n), checkpoints in runs.items():
        for path in checkpoints:
            epochs = offline.trained_epochs(path)
            point = offline.run_depth(target, {(kind, n): path}, prompts, SamplingParams(args.temperature),
                                      args.gamma, args.max_new_tokens, tokenizer.eos_id)  # fmt: skip
            rows += [r | {"epochs": epochs} for r in point]
    table = tables.budget_table(rows)
    print(f"training budget, T = {args.temperature:g}, tau; {dtype_name(target)}\n\n" + table)
    write_outputs(args, "budget", table, lambda out: plots.plot_budget(rows, out / "budget.png"))
    return {"benchmark": "budget", "gamma": args.gamma, "temperature": args.temperature,
            "prompts": prompts_label(args.prompts), "machine": cpu_description(),
            "dtype": dtype_name(target), "results": rows}  # fmt: skip


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
    drafter = exported.get_drafter(args.drafter, target, path)
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
                                   samples=args.samples, prompts_file=args.prompts)  # fmt: skip
    conf, events, mask = rounds.calibration_arrays()
    rows = calibration.position_metrics(conf, events, mask, temperatures)
    table = tables.calibration_table(rows)
    print(f"calibration of {args.drafter} on held-out rounds (eval prompts 0..{args.prompts_per_domain - 1} per "
          f"domain of {prompts_label(args.prompts)}, {args.samples} sample(s) each, T = {args.temperature:g}, gamma = {gamma}), STS "
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

    from dspark.lab.study.counterexample import counterexample

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
