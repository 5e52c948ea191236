"""Every figure the benchmarks and notebooks save: the only module that imports matplotlib.

One function per figure, each taking the rows a benchmark measured (or the
arrays it recorded) and a path to write a PNG to. Matplotlib runs on its
non-interactive Agg backend, chosen once in `_pyplot`, so figures are written
on machines without a display; the notebooks show the saved files or draw
their own figures inline.

  * offline study (paper Figs. 2-5): `plot_position_acceptance`, `plot_depth`,
    `plot_gamma`, `plot_threshold`; the training budget: `plot_budget`;
  * calibration: `plot_reliability` (before/after STS, per position);
  * SPS profiles: `plot_profiles`;
  * serving frontier: `plot_frontier`, `plot_load`.

What this file does not do: measure anything.
"""

from __future__ import annotations

from pathlib import Path

from dspark.calibration import ece, reliability
from dspark.lab.study.stats import wilson_interval
from dspark.scheduler import ThroughputProfile, prefix_survival


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def _panels(count: int, width: float, height: float, **kwargs) -> tuple:
    """A figure with `count` panels side by side and the list of its axes (a list even for one panel: a prompts
    file may hold one domain)."""
    fig, axes = _pyplot().subplots(1, count, figsize=(width * count, height), squeeze=False, **kwargs)
    return fig, list(axes[0])


def plot_position_acceptance(rows: list[dict], path: str | Path, title: str) -> None:
    """Fig. 2 analogue: one panel per domain, one line per drafter (rows of `bench offline`), with 95%
    Wilson intervals where the rows carry their round counts."""
    domains = list(dict.fromkeys(r["domain"] for r in rows))
    fig, axes = _panels(len(domains), 4.2, 3.4, sharey=True)
    for ax, domain in zip(axes, domains):
        for r in rows:
            if r["domain"] == domain and r["cond_acceptance"]:
                tries = r.get("cond_tries") or [0] * len(r["cond_acceptance"])
                pts = [
                    (k + 1, a, n)
                    for k, (a, n) in enumerate(zip(r["cond_acceptance"], tries))
                    if a is not None
                ]
                ks, acc, ns = zip(*pts)
                if any(ns):  # 95% Wilson intervals: late positions rest on few rounds
                    lo, hi = zip(*(wilson_interval(round(a * n), n) for a, n in zip(acc, ns)))
                    err = [
                        [max(0.0, a - low) for a, low in zip(acc, lo)],  # >= 0 despite rounding at 0 and 1
                        [max(0.0, high - a) for a, high in zip(acc, hi)],
                    ]
                    ax.errorbar(ks, acc, yerr=err, marker="o", capsize=2, label=r["drafter"])
                else:
                    ax.plot(ks, acc, marker="o", label=r["drafter"])
        ax.set_title(domain)
        ax.set_xlabel("position k in the block")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("conditional acceptance")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)


def plot_depth(rows: list[dict], path: str | Path) -> None:
    """Fig. 3 analogue: macro τ (and per domain) against backbone layers, per kind."""
    domains = [*dict.fromkeys(r["domain"] for r in rows)]
    fig, axes = _panels(len(domains), 3.4, 3.2)
    for ax, domain in zip(axes, domains):
        for kind in dict.fromkeys(r["kind"] for r in rows):
            pts = sorted((r["layers"], r["tau"]) for r in rows if r["kind"] == kind and r["domain"] == domain)
            ax.plot(*zip(*pts), marker="o", label=kind)
        ax.set_title(domain)
        ax.set_xlabel("drafter layers")
        ax.set_xticks(sorted({r["layers"] for r in rows}))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("τ (tokens per round)")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def plot_budget(rows: list[dict], path: str | Path) -> None:
    """The budget curve: τ (per domain and macro) against training epochs, one line per (kind, layers)."""
    domains = [*dict.fromkeys(r["domain"] for r in rows)]
    fig, axes = _panels(len(domains), 3.4, 3.2, sharey=True)
    for ax, domain in zip(axes, domains):
        for kind, layers in dict.fromkeys((r["kind"], r["layers"]) for r in rows):
            pts = sorted((r["epochs"], r["tau"]) for r in rows
                         if (r["kind"], r["layers"], r["domain"]) == (kind, layers, domain) and r["epochs"])  # fmt: skip
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{kind}-{layers}")
        ax.set_xscale("log")
        # ticks at the budgets measured (a snapshot lands near its mark), not at powers of ten
        marks = sorted({float(f"{r['epochs']:.2g}") for r in rows if r["domain"] == domain and r["epochs"]})
        ax.set_xticks(marks, [f"{e:g}" for e in marks])
        ax.minorticks_off()
        ax.set_title(domain)
        ax.set_xlabel("epochs over the supervised positions")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("τ (tokens per round)")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def plot_gamma(tau_rows: list[dict], latency_rows: list[dict], path: str | Path) -> None:
    """Fig. 4 analogue: τ against γ per domain, and round latency against γ per kind."""
    domains = [*dict.fromkeys(r["domain"] for r in tau_rows)]
    fig, axes = _panels(len(domains) + 1, 3.4, 3.2)
    for ax, domain in zip(axes, domains):
        for kind in dict.fromkeys(r["kind"] for r in tau_rows):
            pts = sorted(
                (r["gamma"], r["tau"]) for r in tau_rows if r["kind"] == kind and r["domain"] == domain
            )
            ax.plot(*zip(*pts), marker="o", label=kind)
        ax.set_title(domain)
        ax.set_xlabel("γ (drafts verified)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("τ (tokens per round)")
    axes[0].legend(fontsize=8)
    ax = axes[-1]
    for kind in dict.fromkeys(r["kind"] for r in latency_rows):
        pts = sorted((r["gamma"], r["round_ms"]) for r in latency_rows if r["kind"] == kind)
        ax.plot(*zip(*pts), marker="o", label=kind)
    batch = latency_rows[0]["batch"] if latency_rows else 0
    ax.set_title(f"round latency, batch {batch}")
    ax.set_xlabel("γ (block size)")
    ax.set_ylabel("ms per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_threshold(rows: list[dict], path: str | Path) -> None:
    """Fig. 5 analogue: accepted/rejected drafts per step (bars) and acceptance rate (line)."""
    domains = [*dict.fromkeys(r["domain"] for r in rows)]
    fig, axes = _panels(len(domains), 4.2, 3.4, sharey=True)
    for ax, domain in zip(axes, domains):
        sub = [r for r in rows if r["domain"] == domain]
        x = [r["threshold"] for r in sub]
        acc = [r["accepted_per_step"] for r in sub]
        rej = [r["rejected_per_step"] for r in sub]
        width = 0.8 * (x[1] - x[0]) if len(x) > 1 else 0.08
        ax.bar(x, acc, width, label="accepted drafts")
        ax.bar(x, rej, width, bottom=acc, hatch="//", alpha=0.6, label="rejected drafts")
        ax.set_title(domain)
        ax.set_xlabel("survival threshold θ")
        rate = ax.twinx()
        rate.plot(x, [r["acceptance_rate"] for r in sub], color="k", marker="o", label="acceptance rate")
        rate.set_ylim(0, 1.05)
        if domain == domains[-1]:
            rate.set_ylabel("acceptance rate")
    axes[0].set_ylabel("draft tokens per step")
    axes[0].legend(fontsize=8, loc="upper right")
    _save(fig, path)


def plot_reliability(
    conf, events, mask, temperatures, path: str | Path, title: str = "", min_rounds: int = 20
) -> None:
    """Reliability diagrams of the prefix survival per position, before and after STS; a bin of fewer than
    `min_rounds` rounds is not drawn (its observed frequency is mostly noise), the ECE counts every round."""
    plt = _pyplot()
    gamma = conf.shape[1]
    raw, cal = prefix_survival(conf), prefix_survival(conf, temperatures)
    fig, axes = _panels(gamma, 2.4, 2.7, sharey=True)
    for k, ax in enumerate(axes):
        m = mask[:, k]
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for label, s, style in (("raw", raw, "o-"), ("STS", cal, "s-")):
            pts = [p for p in reliability(s[m, k], events[m, k]) if p[2] >= min_rounds]
            if pts:
                ax.plot([p for p, _, _ in pts], [o for _, o, _ in pts], style, ms=3,
                        label=f"{label} ECE {100 * ece(s[m, k], events[m, k]):.1f}%")  # fmt: skip
        ax.set_title(f"position {k + 1}", fontsize=9)
        ax.set_xlabel(f"predicted survival (bins ≥ {min_rounds} rounds)", fontsize=7)
        ax.legend(fontsize=6, loc="upper left")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("observed survival")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_profiles(profiles: list[ThroughputProfile], path: str | Path, max_tokens: int = 0) -> None:
    """Steps/s and tokens/s (B · SPS(B)) against B, one line per profile, normalised to SPS(1)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for p in profiles:
        n = min(p.max_tokens, max_tokens) if max_tokens else p.max_tokens
        B = list(range(1, n + 1))
        rel = [p.sps(b) / p.sps(1) for b in B]
        axes[0].plot(B, rel, label=p.name)
        axes[1].plot(B, [b * r for b, r in zip(B, rel)], label=p.name)
    axes[0].set_ylabel("SPS(B) / SPS(1)")
    axes[1].set_ylabel("B · SPS(B) / SPS(1)  (token capacity)")
    for ax in axes:
        ax.set_xlabel("batch tokens B per target pass")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_frontier(points: list[dict], path: str | Path, title: str) -> None:
    """Fig. 7 analogue: throughput against tokens/s per user, one line per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(p["policy"] for p in points):
        pts = sorted(
            (p["concurrency"], p["tps_per_user"], p["throughput"]) for p in points if p["policy"] == policy
        )
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=policy)
        for c, x, y in pts:
            ax.annotate(str(c), (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("throughput (output tokens/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load(points: list[dict], path: str | Path, title: str) -> None:
    """Fig. 8 analogue: throughput and mean verify length against concurrency."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for policy in dict.fromkeys(p["policy"] for p in points):
        pts = sorted(
            (p["concurrency"], p["throughput"], p["mean_verify_len"]) for p in points if p["policy"] == policy
        )
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=policy)
    axes[0].set_ylabel("throughput (output tokens/s)")
    axes[1].set_ylabel("mean verify length per request")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency C")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_training_speed(rows: list[dict], path: str | Path) -> None:
    """`bench training`: supervised (anchor, position) pairs per second, one bar per drafter and setting."""
    plt = _pyplot()
    labels = [f"{r['drafter']} {r['features']} {'all' if r['anchors'] == 0 else r['anchors']} "
              f"{'bf16' if r['bf16'] else 'fp32'}" for r in rows]  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(rows) + 1.2))
    ax.barh(range(len(rows)), [r["supervised_per_s"] for r in rows], color="tab:blue")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("supervised (anchor, draft position) pairs per second")
    ax.grid(axis="x", alpha=0.3)
    _save(fig, path)


def plot_confidences(result: dict, path: str | Path, title: str) -> None:
    """`bench confidence`: AUROC and ECE by position of the trained head and the online confidence (both after
    STS), and Algorithm 1's simulated throughput with each, against verifying every draft and the oracle."""
    fig, (auc, cal, serve) = _panels(3, 4.2, 3.4)
    for name, style in (("head", "o-"), ("online", "s--")):
        rows = result["confidences"][name]["positions"]
        ks = [r["k"] for r in rows]
        auc.plot(ks, [r["auroc"] for r in rows], style, label=name)
        cal.plot(ks, [100 * r["ece_after"] for r in rows], style, label=f"{name} + STS")
    cal.plot(ks, [100 * r["ece_noise_floor"] for r in result["confidences"]["head"]["positions"]], ":",
             color="grey", label="noise floor")  # fmt: skip
    auc.set(xlabel="position k", ylabel="AUROC of the survival a_k", title="ranking")
    cal.set(xlabel="position k", ylabel="ECE (%)", title="calibration")
    for name in ("fixed", "head", "online", "oracle"):
        pts = sorted((r["concurrency"], r["throughput"]) for r in result["serve"] if r["confidence"] == name)
        serve.plot(
            [c for c, _ in pts], [t for _, t in pts], "o-", label="verify all" if name == "fixed" else name
        )
    serve.set(xscale="log", xlabel="concurrency", ylabel="simulated tokens/s", title="Algorithm 1")
    for ax in (auc, cal, serve):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
