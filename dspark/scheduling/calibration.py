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
  * `fit_sts(..., shifts=True)` searches a logit offset b_k next to T_k,
    c̃_k = σ(logit(c_k) / T_k - b_k) (Platt scaling, one position at a time): a
    head that is over-confident in its middle range but right when it is sure
    (the shipped DSpark head at position 1) needs a shift, which no temperature
    gives -- a temperature pulls the sure drafts towards 1/2 as much as the
    middle ones. The paper fits temperatures only; `select_sts` uses the offsets.

Metrics per position: ECE (equal-width bins, weighted |mean prediction -
frequency|), AUROC (Mann-Whitney rank statistic) and Brier score; plus the
reliability curve behind the diagrams. The temperatures are stored as the
`calibration` record of a JSON file (the drafter checkpoint's twin, or for a
shipped drafter a file under DSPARK_HOME: `train calibrate` never writes into
the package) and applied by `scheduler.prefix_survival`.

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
from dspark.scheduling.scheduler import prefix_survival, temperatures_and_offsets

FIT_PROMPTS = (40, 80)  # eval prompts [40, 80) per domain fit STS; benchmarks report on [0, 40)
BINS = 15  # reliability bins
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)  # 0.03 .. 31.6
SHIFT_GRID = torch.linspace(-1.0, 1.0, 41, dtype=torch.float64)  # logit offsets b, step 0.05
TOLERANCE = 0.002  # ECE differences below this are noise when choosing a temperature
MIN_SURVIVORS = 50  # fitting rounds that must reach a position before its temperature is trusted


def ece_rows(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> torch.Tensor:
    """(S,) expected calibration errors over equal-width bins of the prediction: every row of (S, n)
    predictions against the (n,) events, or against the rows of (S, n) events."""
    rows, n = pred.shape
    idx = (pred * bins).long().clamp(0, bins - 1) + bins * torch.arange(rows, device=pred.device)[:, None]
    sum_pred = torch.bincount(idx.flatten(), pred.double().flatten(), minlength=rows * bins)
    sum_obs = torch.bincount(idx.flatten(), obs.double().expand(rows, n).flatten(), minlength=rows * bins)
    return (sum_pred - sum_obs).abs().view(rows, bins).sum(1) / max(n, 1)


def ece(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> float:
    """Expected calibration error over equal-width bins of the prediction."""
    return float("nan") if pred.numel() == 0 else float(ece_rows(pred[None], obs, bins)[0])


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


def fit_sts(
    conf: torch.Tensor, events: torch.Tensor, mask: torch.Tensor, shifts: bool = False
) -> torch.Tensor:
    """(γ,) temperatures, fitted left to right (each with the earlier ones fixed); with `shifts`,
    (2, γ): the temperatures and the logit offsets b_k searched with them (`prefix_survival` reads both)."""
    gamma, device = conf.shape[1], conf.device
    # with offsets every other temperature (steps of 6% instead of 3%): a 121 x 41 grid per position
    grid = TEMPERATURE_GRID[:: 2 if shifts else 1].to(device)
    offsets = SHIFT_GRID.to(device) if shifts else torch.zeros(1, dtype=torch.float64, device=device)
    sts = torch.zeros(2, gamma, dtype=torch.float64, device=device)  # rows: T_k, b_k
    sts[0] = 1.0
    logit = torch.logit(conf.double().clamp(1e-12, 1 - 1e-12))
    prefix = torch.ones(conf.shape[0], dtype=torch.float64, device=device)  # Π_{i<k} c̃_i
    for k in range(gamma):
        m = mask[:, k]
        if int(m.sum()) == 0:
            break
        z, before = logit[m, k], prefix[m]  # (n,)
        errors = torch.stack([ece_rows(before * torch.sigmoid(z / t - offsets[:, None]), events[m, k])
                              for t in grid])  # (temperatures, offsets)  # fmt: skip
        # ECE is a noisy, flat objective at late positions: among the (T, b) within TOLERANCE of
        # the best, take the one closest to the head as trained (T = 1, b = 0)
        near = (errors <= errors.min() + TOLERANCE).nonzero()  # (n_near, 2) grid indices
        change = grid[near[:, 0]].log().abs() + offsets[near[:, 1]].abs()
        i, j = near[change.argmin()]
        sts[0, k], sts[1, k] = grid[i], offsets[j]
        prefix = prefix * torch.sigmoid(logit[:, k] / sts[0, k] - sts[1, k])
    return sts if shifts else sts[0]


def select_sts(
    conf: torch.Tensor,
    events: torch.Tensor,
    mask: torch.Tensor,
    fit_rows: torch.Tensor | None = None,
    min_survivors: int = MIN_SURVIVORS,
    shifts: bool = True,
) -> tuple[torch.Tensor, list[str]]:
    """STS that cannot make things worse: (2, γ) temperatures and logit offsets ((γ,) temperatures
    without `shifts`) and, per position, why they were kept or not.

    They are fitted (`fit_sts`) on the rounds in `fit_rows` (default: every other round) and checked,
    left to right, on the others: position k's (T_k, b_k) is kept only if at least `min_survivors`
    fitting rounds reached position k (their drafts 1..k-1 all accepted), the held-out ECE of the
    prefix survival at k, with what was already chosen before k, is lower with it than with the head
    as trained (T = 1, b = 0), and the held-out ECE of none of the later positions (whose products it
    also scales) is higher. Otherwise position k keeps T = 1, b = 0."""
    rows = torch.arange(conf.shape[0], device=conf.device)
    fit_rows = rows % 2 == 0 if fit_rows is None else fit_rows
    check = ~fit_rows
    temps = fit_sts(conf[fit_rows], events[fit_rows], mask[fit_rows], shifts=shifts)
    fitted = torch.stack(temperatures_and_offsets(temps))  # (2, γ)
    chosen = torch.stack([torch.ones_like(fitted[0]), torch.zeros_like(fitted[1])])
    reasons = []
    for k in range(conf.shape[1]):
        reached = mask[fit_rows, k] & (events[fit_rows, k - 1].bool() if k else True)
        m = mask[check, k]
        what = f"T = {float(fitted[0, k]):.3f}" + (f", b = {float(fitted[1, k]):+.3f}" if shifts else "")
        if int(reached.sum()) < min_survivors:
            reasons.append(f"T = 1: only {int(reached.sum())} fitting rounds reach position {k + 1}")
            continue
        trial = chosen.clone()
        trial[:, k] = fitted[:, k]
        held_out = [prefix_survival(conf[check], t) for t in (chosen, trial)]  # later positions as trained
        before, after = (ece(a[m, k], events[check][m, k]) for a in held_out)
        if not after < before:
            reasons.append(
                f"T = 1: {what} does not lower held-out ECE ({100 * after:.1f}% vs {100 * before:.1f}%)"
            )
            continue
        # it also moves every later prefix product: none of them may get worse
        later = [[ece(a[mask[check, j], j], events[check][mask[check, j], j]) for j in range(k + 1, conf.shape[1])]
                 for a in held_out]  # fmt: skip
        worse = [(j, old, new) for j, (old, new) in enumerate(zip(*later), start=k + 2) if new > old]
        if worse:
            j, old, new = worse[0]
            reasons.append(f"T = 1: {what} lowers held-out ECE at {k + 1} but raises it at {len(worse)} later "
                           f"position(s) (at {j}: {100 * new:.2f}% vs {100 * old:.2f}%)")  # fmt: skip
            continue
        chosen[:, k] = fitted[:, k]
        reasons.append(f"{what}: held-out ECE {100 * before:.1f}% -> {100 * after:.1f}%")
    return (chosen if shifts else chosen[0]), reasons


def ece_change_interval(
    before: torch.Tensor, after: torch.Tensor, obs: torch.Tensor, draws: int = 200, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval of ECE(after) - ECE(before) over the same rounds (resampled together):
    whether a calibration really changed the ECE, or only moved it within the sampling noise."""
    if obs.numel() == 0:
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, obs.numel(), (draws, obs.numel()), generator=g, device="cpu").to(
        obs.device
    )  # (D, n)
    changes = (ece_rows(after[picks], obs[picks]) - ece_rows(before[picks], obs[picks])).sort().values
    return float(changes[int(0.025 * draws)]), float(changes[int(0.975 * draws) - 1])


def position_metrics(
    conf: torch.Tensor, events: torch.Tensor, mask: torch.Tensor, temperatures: torch.Tensor | None
) -> list[dict]:
    """Per position k: ECE before (raw) and after (with `temperatures`), the 95% bootstrap interval of
    their difference, the ECE noise floor, AUROC and Brier after."""
    raw, cal = prefix_survival(conf), prefix_survival(conf, temperatures)
    rows = []
    for k in range(conf.shape[1]):
        m = mask[:, k]
        y = events[m, k]
        rows.append({"k": k + 1, "rounds": int(m.sum()), "survival_rate": float(y.mean()) if len(y) else None,
                     "ece_before": ece(raw[m, k], y), "ece_after": ece(cal[m, k], y),
                     "ece_change_95": ece_change_interval(raw[m, k], cal[m, k], y),
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


def describe_sts(temperatures: torch.Tensor) -> str:
    """'T 1.00 1.26 ...' (and '; b +0.10 ...' with logit offsets) for logs and tables."""
    temps, offsets = temperatures_and_offsets(temperatures)
    text = "T " + " ".join(f"{float(t):.2f}" for t in temps)
    return text + ("; b " + " ".join(f"{float(b):+.2f}" for b in offsets) if temperatures.dim() == 2 else "")


def save_temperatures(drafter_path: str | Path, temperatures: torch.Tensor, info: dict) -> Path:
    """Store the STS temperatures (γ,) -- or temperatures and logit offsets (2, γ) -- as the `calibration`
    record (`sts_temperatures`, `sts_shifts`, then `info`) of a JSON file: the drafter checkpoint's twin, or a
    calibration file of its own (created when missing; dspark/drafters/registry.py `calibration_path`).
    Returns the file written."""
    path = config_path(drafter_path)
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); store the calibration in a new file") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not an object; store the calibration "
                         "in a new file")  # fmt: skip
    temps, offsets = temperatures_and_offsets(temperatures)
    stored = {"sts_temperatures": [round(float(t), 5) for t in temps]}
    if temperatures.dim() == 2:
        stored["sts_shifts"] = [round(float(b), 5) for b in offsets]
    record["calibration"] = {**stored, **info}
    paths.write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return path
