"""Markdown tables of the benchmarks: the rows `dspark.lab.study` measures, formatted for the README.

Each function takes the list of row dicts a `run_*` function of dspark/lab/study/offline.py
(or the calibration metrics) returned and gives back one markdown table, so the
same numbers print on the terminal, go into `--out` files and into the README.

What this file does not do: measure anything, or plot (dspark/lab/study/plots.py).
"""

from __future__ import annotations

from dspark.lab.study.offline import macro


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ar_table(rows: list[dict]) -> str:
    """Markdown of `run_ar`'s rows."""
    lines = ["| batch | tokens/s | decode tokens/s | tokens/s per request | ms per step | prefill ms |",
             "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {r['batch']} | {r['tokens_per_s']:.0f} | {r['decode_tokens_per_s']:.0f} | "
              f"{r['tokens_per_s_per_request']:.1f} | {r['ms_per_step']:.2f} | {r['prefill_ms']:.1f} |"
              for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def speedup_table(rows: list[dict]) -> str:
    """Markdown of `run_speedup`'s rows, one per temperature, domain and drafter: with the mean verify
    length and, at T = 0, how many prompts gave plain decoding's exact text."""
    lines = ["| T | drafter | domain | tau | verified | tokens/s | speed-up | text = plain | "
             "conditional acceptance by position |", "|---|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["cond_acceptance"])
        verified = f"{r['mean_verify_len']:.2f}" if "mean_verify_len" in r else "-"
        timed = r["tokens_per_s"] is not None  # (None: measured with --tau-only, no clock)
        tps, speedup = (f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x") if timed else ("-", "-")
        lines.append(f"| {r['temperature']:g} | {r['drafter']} | {r['domain']} | {r['tau']:.2f} | {verified} | "
                     f"{tps} | {speedup} | {r.get('same_as_plain', '-')} | {acc} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def table1(rows: list[dict]) -> str:
    """Markdown of `run_speedup`'s rows: one row per drafter, tau per domain and macro average,
    per temperature, + speed-up."""
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
            line += [sub[d]["tau"] for d in domains] + [macro([sub[d]["tau"] for d in domains])]
            timed = all(sub[d]["speedup"] is not None for d in domains)
            line.append(", ".join(f"{sub[d]['speedup']:.2f}x" for d in domains) if timed else None)
        body.append(line)
    return markdown_table(header, body)


def ratio_table(rows: list[dict]) -> str:
    """Markdown of `tau_intervals.ratio_rows`: macro-τ ratios of drafter pairs with 95% paired intervals."""
    lines = [
        "| T | macro tau ratio | ratio | 95% interval (prompts resampled, paired) |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {r['temperature']:g} | {r['a']} / {r['b']} | {r['ratio']:.3f} | {r['low']:.3f} .. {r['high']:.3f} |"
              for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def domain_taus(rows: list[dict], summary: dict, domains: list[str], fields: tuple[str, ...]) -> list[float]:
    """τ per domain of the rows that agree with a macro `summary` row on `fields`, in `domains` order."""
    same = [r for r in rows if all(r[f] == summary[f] for f in fields)]
    return [next(r["tau"] for r in same if r["domain"] == d) for d in domains]


def depth_table(rows: list[dict]) -> str:
    """τ per domain and macro per (kind, layers); with `run_depth`'s extras, the mean validation c*, the
    checkpoint's MB and the drafting ms per batch size (and, when the points were timed on several machines,
    each one's)."""
    domains = list(dict.fromkeys(r["domain"] for r in rows if r["domain"] != "macro"))
    summaries = [r for r in rows if r["domain"] == "macro"]
    batches = list(summaries[0].get("draft_ms", {})) if summaries else []
    machines = list(dict.fromkeys(s.get("machine") for s in summaries))
    timed_on = len(machines) > 1  # points merged from another session's run: say where each was timed
    header = ["drafter", "layers", "MB", "val c* (mean)", *domains, "macro τ",
              *(f"draft ms (batch {n})" for n in batches), *(["timed on"] if timed_on else [])]  # fmt: skip
    body = []
    for s in summaries:
        tau = domain_taus(rows, s, domains, ("kind", "layers"))
        c_star = s.get("val_c_star")
        body.append([s["kind"], s["layers"], s.get("megabytes"), f"{macro(c_star):.3f}" if c_star else None, *tau,
                     s["tau"], *(s.get("draft_ms", {}).get(n) for n in batches),
                     *([s.get("machine")] if timed_on else [])])  # fmt: skip
    return markdown_table(header, body)


def budget_table(rows: list[dict]) -> str:
    """τ per domain and macro per (kind, layers, epochs) of `bench budget`, with the mean validation c*."""
    domains = list(dict.fromkeys(r["domain"] for r in rows if r["domain"] != "macro"))
    body = []
    for s in (r for r in rows if r["domain"] == "macro"):
        tau = domain_taus(rows, s, domains, ("kind", "layers", "epochs"))
        c_star = s.get("val_c_star")
        epochs = None if s["epochs"] is None else f"{s['epochs']:.2f}"
        body.append(
            [s["kind"], s["layers"], epochs, f"{macro(c_star):.3f}" if c_star else None, *tau, s["tau"]]
        )
    return markdown_table(["drafter", "layers", "epochs", "val c* (mean)", *domains, "macro τ"], body)


def gamma_table(tau_rows: list[dict], latency_rows: list[dict], latency_batch: int) -> str:
    domains = list(dict.fromkeys(r["domain"] for r in tau_rows))
    header = ["drafter", "γ", *domains, "macro", f"round ms (batch {latency_batch})", "draft ms"]
    body = []
    for label, gamma in dict.fromkeys((r["kind"], r["gamma"]) for r in latency_rows):
        tau = [next(r["tau"] for r in tau_rows if (r["kind"], r["domain"], r["gamma"]) == (label, d, gamma))
               for d in domains]  # fmt: skip
        lat = next(r for r in latency_rows if (r["kind"], r["gamma"]) == (label, gamma))
        body.append([label, gamma, *tau, macro(tau), lat["round_ms"], lat["draft_ms"]])
    return markdown_table(header, body)


def threshold_table(rows: list[dict]) -> str:
    body = [[r["domain"], r["threshold"], r["accepted_per_step"], r["rejected_per_step"],
             None if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.1f}%"] for r in rows]  # fmt: skip
    return markdown_table(
        ["domain", "θ", "accepted drafts / step", "rejected drafts / step", "acceptance rate"], body
    )


def change_interval(bounds: tuple[float, float]) -> str:
    """'-0.21 .. +0.35' points, or 'none' when both ends are zero (the same calibration)."""
    low, high = (100 * x for x in bounds)
    return "none" if max(abs(low), abs(high)) < 0.005 else f"{low:+.2f} .. {high:+.2f}"


def calibration_table(rows: list[dict]) -> str:
    """Markdown of `calibration.position_metrics` rows (Fig. 6)."""
    body = [[r["k"], r["rounds"], r["survival_rate"], f"{100 * r['ece_before']:.1f}%", f"{100 * r['ece_after']:.1f}%",
             change_interval(r["ece_change_95"]),
             f"{100 * r['ece_noise_floor']:.1f}%", None if r["auroc"] is None else f"{r['auroc']:.3f}",
             f"{r['brier']:.3f}"] for r in rows]  # fmt: skip
    return markdown_table(["k", "rounds", "observed survival", "ECE before", "ECE after STS",
                           "after - before, 95% (points)", "ECE noise floor", "AUROC", "Brier"], body)  # fmt: skip


def training_speed_table(rows: list[dict]) -> str:
    """`bench training`: one row per drafter and setting."""
    return markdown_table(
        ["drafter", "features", "anchors/seq", "precision", "s/step", "anchors/s", "supervised/s", "speed-up"],
        [[r["drafter"], r["features"], "all" if r["anchors"] == 0 else r["anchors"], "bf16" if r["bf16"] else "fp32",
          f"{r['seconds_per_step']:.2f}", f"{r['anchors_per_s']:.0f}", f"{r['supervised_per_s']:.0f}",
          f"{r['speedup']:.1f}×"] for r in rows],
    )  # fmt: skip
