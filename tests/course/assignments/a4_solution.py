"""Assignment 4, solved from scratch (no dspark.calibration): the base of the a4_* bugs."""

from __future__ import annotations

import torch

BINS = 15
TEMPERATURE_GRID = torch.logspace(-1.5, 1.5, 241, dtype=torch.float64)
TOLERANCE = 0.002


def confidence_label(q, p):
    return torch.minimum(q, p).sum(dim=-1)


def events_and_mask(verify_lens, accepted, gamma):
    k = torch.arange(1, gamma + 1)[None, :]
    return (k <= accepted[:, None]).double(), k <= verify_lens[:, None]


def ece(pred, obs, bins=BINS):
    which = torch.clamp((pred.double() * bins).floor().long(), 0, bins - 1)
    predicted = torch.zeros(bins, dtype=torch.float64).index_add_(0, which, pred.double())
    observed = torch.zeros(bins, dtype=torch.float64).index_add_(0, which, obs.double())
    # per bin |mean prediction − frequency| · (bin size / N) = |Σ pred − Σ obs| / N
    return float((predicted - observed).abs().sum() / len(pred))


def auroc(score, label):
    positives, negatives = score[label == 1].double(), score[label == 0].double()
    if len(positives) == 0 or len(negatives) == 0:
        return None
    wins = (positives[:, None] > negatives[None, :]).double().sum()
    ties = (positives[:, None] == negatives[None, :]).double().sum()
    return float((wins + 0.5 * ties) / (len(positives) * len(negatives)))


def scaled(confidences, temperature):
    logit = torch.logit(confidences.double().clamp(1e-12, 1 - 1e-12))
    return torch.sigmoid(logit / temperature)


def calibrated_survival(confidences, temperatures=None):
    if temperatures is None:
        return confidences.double().cumprod(dim=1)
    return scaled(confidences, temperatures.double()[: confidences.shape[1]]).cumprod(dim=1)


def best_temperature(before, conf_k, events_k):
    errors = torch.tensor([ece(before * scaled(conf_k, t), events_k) for t in TEMPERATURE_GRID])
    good = TEMPERATURE_GRID[errors <= errors.min() + TOLERANCE]
    return good[good.log().abs().argmin()]


def fit_sts(confidences, events, mask):
    gamma = confidences.shape[1]
    temps = torch.ones(gamma, dtype=torch.float64)
    survival = torch.ones(confidences.shape[0], dtype=torch.float64)
    for k in range(gamma):
        rows = mask[:, k]
        if not rows.any():
            break
        temps[k] = best_temperature(survival[rows], confidences[rows, k], events[rows, k])
        survival = survival * scaled(confidences[:, k], temps[k])
    return temps
