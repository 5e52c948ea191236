"""Sequential Temperature Scaling (STS) of the confidence head, and its metrics.

The scheduler ranks prefix survivals a_k = Π_{i<=k} c_i, so they must be
calibrated in absolute terms: a_k should be the probability that drafts 1..k
are all accepted. walkthrough/DESIGN.md section 4 / paper section 3.2.1:

  * record rounds with FULL verification on held-out prompts: raw confidences
    c_1..c_γ and the accepted count a; the event at position k is a >= k;
  * for k = 1..γ in order, grid-search one temperature T_k for the logit of
    c_k, c̃_k = σ(logit(c_k) / T_k), minimising the ECE of Π_{i<=k} c̃_i against
    the event, with T_1..T_{k-1} already fixed (ties within 0.2 points of ECE go
    to the temperature closest to 1). Monotone in each c_k, so the ranking
    inside a position is unchanged.

Metrics per position: ECE (equal-width bins, weighted |mean prediction -
frequency|), AUROC (Mann-Whitney rank statistic) and Brier score; plus the
reliability curve behind the diagrams. The temperatures are stored in the
drafter checkpoint's JSON twin (`calibration.sts_temperatures`) and applied by
`scheduler.prefix_survival`.

Tensors are made on the device of the recorded arrays (the engine's records are
host lists, so usually the CPU); the metrics are Python numbers, read back as they
are computed (offline, not per engine step).

What this file does not do: choose verify lengths (dspark/scheduling/scheduler.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark import paths
from dspark.checkpoint import config_path
from dspark.device import generator_uniforms
from dspark.scheduling.scheduler import prefix_survival

FIT_PROMPTS = (40, 80)  # eval prompts [40, 80) per domain fit STS; benchmarks report on [0, 40)
BINS = 15  # reliability bins
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)  # 0.03 .. 31.6
TOLERANCE = 0.002  # ECE differences below this are noise when choosing a temperature
MIN_SURVIVORS = 50  # fitting rounds that must reach a position before its temperature is trusted


def ece(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> float:
    """Expected calibration error over equal-width bins of the prediction."""
    if pred.numel() == 0:
        return float("nan")
    idx = (pred * bins).long().clamp(0, bins - 1)
    sum_pred = torch.bincount(idx, pred.double(), minlength=bins)
    sum_obs = torch.bincount(idx, obs.double(), minlength=bins)
    return float((sum_pred - sum_obs).abs().sum() / pred.numel())


def ece_noise_floor(pred: torch.Tensor, draws: int = 20, seed: int = 0) -> float:
    """Mean ECE of a *perfectly calibrated* predictor with these predictions: events drawn
    as Bernoulli(pred). ECE estimates are biased upwards by sampling noise; this is that
    bias at this sample size, the level below which a measured ECE means nothing."""
    if pred.numel() == 0:
        return float("nan")
    g = torch.Generator().manual_seed(seed)  # on the CPU, whatever pred's device: the same draws everywhere
    return sum(ece(pred, (generator_uniforms(tuple(pred.shape), g, pred.device, torch.float64) < pred).double())
               for _ in range(draws)) / draws  # fmt: skip


def auroc(score: torch.Tensor, label: torch.Tensor) -> float | None:
    """Probability that a random positive scores above a random negative (ties count ½)."""
    pos, neg = int(label.sum()), int((1 - label).sum())
    if pos == 0 or neg == 0:
        return None
    values, inverse, counts = torch.unique(score.double(), return_inverse=True, return_counts=True)
    below = torch.cumsum(counts, 0) - counts  # scores strictly below each distinct value
    ranks = (below + (counts + 1) / 2).double()[inverse]  # 1-based ranks, ties averaged
    return float((ranks[label.bool()].sum() - pos * (pos + 1) / 2) / (pos * neg))


def fit_sts(conf: torch.Tensor, events: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(γ,) temperatures, fitted left to right (each with the earlier ones fixed)."""
    gamma, device = conf.shape[1], conf.device
    grid = TEMPERATURE_GRID.to(device)
    temps = torch.ones(gamma, dtype=torch.float64, device=device)
    logit = torch.logit(conf.double().clamp(1e-12, 1 - 1e-12))
    prefix = torch.ones(conf.shape[0], dtype=torch.float64, device=device)  # Π_{i<k} c̃_i
    for k in range(gamma):
        m = mask[:, k]
        if int(m.sum()) == 0:
            break
        errors = torch.tensor(
            [ece(prefix[m] * torch.sigmoid(logit[m, k] / t), events[m, k]) for t in grid], device=device
        )
        # ECE is a noisy, flat objective at late positions: among the temperatures within
        # TOLERANCE of the best, take the one closest to 1 (the least change to the head)
        near_best = (errors <= errors.min() + TOLERANCE).nonzero().flatten()
        temps[k] = grid[near_best[grid[near_best].log().abs().argmin()]]
        prefix = prefix * torch.sigmoid(logit[:, k] / temps[k])
    return temps


def select_sts(
    conf: torch.Tensor,
    events: torch.Tensor,
    mask: torch.Tensor,
    fit_rows: torch.Tensor | None = None,
    min_survivors: int = MIN_SURVIVORS,
) -> tuple[torch.Tensor, list[str]]:
    """STS that cannot make things worse: (γ,) temperatures and, per position, why T_k was kept or not.

    The temperatures are fitted (`fit_sts`) on the rounds in `fit_rows` (default: every other round)
    and checked, left to right, on the others: T_k is kept only if at least `min_survivors` fitting
    rounds reached position k (their drafts 1..k-1 all accepted), the held-out ECE of the prefix
    survival at k, with the temperatures already chosen before k, is lower with T_k than with 1, and
    the held-out ECE summed over the later positions (which T_k also scales) is not higher.
    Otherwise position k keeps T = 1 (the head as trained)."""
    rows = torch.arange(conf.shape[0], device=conf.device)
    fit_rows = rows % 2 == 0 if fit_rows is None else fit_rows
    check = ~fit_rows
    fitted = fit_sts(conf[fit_rows], events[fit_rows], mask[fit_rows])
    chosen = torch.ones_like(fitted)
    reasons = []
    for k in range(conf.shape[1]):
        reached = mask[fit_rows, k] & (events[fit_rows, k - 1].bool() if k else True)
        m = mask[check, k]
        if int(reached.sum()) < min_survivors:
            reasons.append(f"T = 1: only {int(reached.sum())} fitting rounds reach position {k + 1}")
            continue
        trial = chosen.clone()
        trial[k] = fitted[k]
        held_out = [prefix_survival(conf[check], t) for t in (chosen, trial)]  # later positions at T = 1
        before, after = (ece(a[m, k], events[check][m, k]) for a in held_out)
        if not after < before:
            reasons.append(f"T = 1: T = {float(fitted[k]):.3f} does not lower held-out ECE "
                           f"({100 * after:.1f}% vs {100 * before:.1f}%)")  # fmt: skip
            continue
        later = [sum(ece(a[mask[check, j], j], events[check][mask[check, j], j]) for j in range(k + 1, conf.shape[1]))
                 for a in held_out]  # fmt: skip
        if later[1] > later[0]:  # T_k also moves every later prefix product: none may get worse in sum
            reasons.append(f"T = 1: T = {float(fitted[k]):.3f} lowers held-out ECE at {k + 1} but raises it at "
                           f"the later positions ({100 * later[1]:.1f} vs {100 * later[0]:.1f} points in sum)")  # fmt: skip
            continue
        chosen[k] = fitted[k]
        reasons.append(f"T = {float(fitted[k]):.3f}: held-out ECE {100 * before:.1f}% -> {100 * after:.1f}%")
    return chosen, reasons


def position_metrics(
    conf: torch.Tensor, events: torch.Tensor, mask: torch.Tensor, temperatures: torch.Tensor | None
) -> list[dict]:
    """Per position k: ECE before (raw) and after (with `temperatures`), AUROC and Brier after."""
    raw, cal = prefix_survival(conf), prefix_survival(conf, temperatures)
    rows = []
    for k in range(conf.shape[1]):
        m = mask[:, k]
        y = events[m, k]
        rows.append({"k": k + 1, "rounds": int(m.sum()), "survival_rate": float(y.mean()) if len(y) else None,
                     "ece_before": ece(raw[m, k], y), "ece_after": ece(cal[m, k], y),
                     "ece_noise_floor": ece_noise_floor(cal[m, k]),
                     "auroc": auroc(cal[m, k], y), "brier": float(((cal[m, k] - y) ** 2).mean()) if len(y) else None})  # fmt: skip
    return rows


def reliability(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> list[tuple[float, float, int]]:
    """(mean prediction, observed frequency, count) of every non-empty bin."""
    idx = (pred * bins).long().clamp(0, bins - 1)
    out = []
    for b in range(bins):
        sel = idx == b
        if bool(sel.any()):
            out.append((float(pred[sel].mean()), float(obs[sel].double().mean()), int(sel.sum())))
    return out


def save_temperatures(drafter_path: str | Path, temperatures: torch.Tensor, info: dict) -> None:
    """Store the STS temperatures in the drafter checkpoint's JSON twin."""
    path = config_path(drafter_path)
    record = json.loads(path.read_text())
    record["calibration"] = {"sts_temperatures": [round(float(t), 5) for t in temperatures], **info}
    paths.write_text_atomic(path, json.dumps(record, indent=2) + "\n")
