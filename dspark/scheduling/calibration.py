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
    middle ones. The paper fits temperatures only.

Metrics: ECE (equal-width bins, weighted |mean prediction - frequency|), AUROC
(Mann-Whitney rank statistic), and the reliability curve behind the diagrams.
The temperatures are applied by `scheduler.prefix_survival`; which fit to keep
(checked on held-out rounds), the metrics per position and storing them are
the lab's (dspark/lab/calibration.py, `python -m dspark.train calibrate`).

Tensors are made on the device of the recorded arrays (the engine's records are
host lists, so usually the CPU); the metrics are Python numbers, read back as they
are computed (offline, not per engine step).

What this file does not do: choose verify lengths (dspark/scheduling/scheduler.py).
"""

from __future__ import annotations

import torch

BINS = 15  # reliability bins
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)  # 0.03 .. 31.6
SHIFT_GRID = torch.linspace(-1.0, 1.0, 41, dtype=torch.float64)  # logit offsets b, step 0.05
TOLERANCE = 0.002  # ECE differences below this are noise when choosing a temperature


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


def reliability(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> list[tuple[float, float, int]]:
    """(mean prediction, observed frequency, count) of every non-empty bin."""
    idx = (pred * bins).long().clamp(0, bins - 1)
    out = []
    for b in range(bins):
        sel = idx == b
        if bool(sel.any()):
            out.append((float(pred[sel].mean()), float(obs[sel].double().mean()), int(sel.sum())))
    return out
