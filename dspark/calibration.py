"""Sequential Temperature Scaling (STS) of the confidence head, and its metrics.

The scheduler ranks prefix survivals a_k = Π_{i<=k} c_i, so a_k must be the probability that drafts 1..k
are all accepted (DESIGN.md section 4). From fully verified rounds (event at k: accepted >= k), for
k = 1..γ in order, with T_1..T_{k-1} fixed, grid-search

    c̃_k = σ(logit(c_k) / T_k − b_k)     minimising ECE(Π_{i<=k} c̃_i, event_k)     (b_k = 0 unless `shifts`)

With offsets (this project's addition to the paper) ECE has a useless minimum: T → ∞ and b at the base
rate give every round the same survival, ECE ≈ 0, and nothing left to rank. So (T_k, b_k) minimise the
log-loss instead, a proper score that a constant cannot win. Monotone in c_k, so the ranking inside a
position is unchanged. Runs offline: the metrics are Python numbers.
"""

from __future__ import annotations

import torch

BINS = 15  # reliability bins
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)  # 0.03 .. 31.6
SHIFT_GRID = torch.linspace(-2.0, 2.0, 81, dtype=torch.float64)  # logit offsets b, step 0.05
TOLERANCE = 0.002  # ECE differences below this are noise when choosing a temperature
LOG_LOSS_TOLERANCE = 0.0002  # the same for log-loss differences (nats per round), choosing (T, b)


def ece_rows(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> torch.Tensor:
    """(S,) ECE over equal-width bins of each row of (S, n) predictions against (n,) or (S, n) events."""
    rows, n = pred.shape
    idx = (pred * bins).long().clamp(0, bins - 1) + bins * torch.arange(rows, device=pred.device)[:, None]
    sum_pred = torch.bincount(idx.flatten(), pred.double().flatten(), minlength=rows * bins)
    sum_obs = torch.bincount(idx.flatten(), obs.double().expand(rows, n).flatten(), minlength=rows * bins)
    return (sum_pred - sum_obs).abs().view(rows, bins).sum(1) / max(n, 1)


def ece(pred: torch.Tensor, obs: torch.Tensor, bins: int = BINS) -> float:
    """Expected calibration error over equal-width bins of the prediction."""
    return float("nan") if pred.numel() == 0 else float(ece_rows(pred[None], obs, bins)[0])


def log_loss_rows(pred: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """(S,) mean binary cross-entropy of each row of (S, n) predictions against (n,) events."""
    p = pred.double().clamp(1e-12, 1 - 1e-12)
    return -(obs * p.log() + (1 - obs) * (1 - p).log()).mean(-1)


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
    """(γ,) temperatures fitted left to right; with `shifts` (2, γ): temperatures and offsets b_k."""
    gamma, device = conf.shape[1], conf.device
    # with offsets every other temperature: a 121 x 41 grid per position
    grid = TEMPERATURE_GRID[:: 2 if shifts else 1].to(device)
    offsets = SHIFT_GRID.to(device) if shifts else torch.zeros(1, dtype=torch.float64, device=device)
    sts = torch.zeros(2, gamma, dtype=torch.float64, device=device)  # rows: T_k, b_k
    sts[0] = 1.0
    score, tolerance = (log_loss_rows, LOG_LOSS_TOLERANCE) if shifts else (ece_rows, TOLERANCE)  # see the top
    logit = torch.logit(conf.double().clamp(1e-12, 1 - 1e-12))
    prefix = torch.ones(conf.shape[0], dtype=torch.float64, device=device)  # Π_{i<k} c̃_i
    for k in range(gamma):
        m = mask[:, k]
        if int(m.sum()) == 0:
            break
        z, before = logit[m, k], prefix[m]  # (n,)
        scaled = (before * torch.sigmoid(z / t - offsets[:, None]) for t in grid)  # (offsets, rounds) each
        errors = torch.stack([score(a, events[m, k]) for a in scaled])  # (temperatures, offsets)
        # the score is flat and noisy: of the near-best (T, b), take the closest to (1, 0)
        near = (errors <= errors.min() + tolerance).nonzero()  # (n_near, 2) grid indices
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
