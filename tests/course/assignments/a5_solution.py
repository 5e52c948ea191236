"""Assignment 5, solved from scratch (no dspark.scheduler functions): the base of the a5_* bugs."""

from __future__ import annotations

import torch


def prefix_survival(confidences):
    return confidences.double().cumprod(dim=1)


def greedy_path(survivals):
    R, gamma = survivals.shape
    candidates = [(r, j) for r in range(R) for j in range(gamma)]
    candidates.sort(key=lambda rj: (-float(survivals[rj]), rj[1], rj[0]))
    return torch.tensor(candidates, dtype=torch.long).view(-1, 2)


def path_rates(survivals, profile):
    R = survivals.shape[0]
    tau, rates = float(R), [R * profile.sps(R)] if R else [0.0]
    for n, (r, j) in enumerate(greedy_path(survivals).tolist(), start=1):
        tau += float(survivals[r, j])
        rates.append(tau * profile.sps(R + n))
    return rates


def prefix_schedule(survivals, profile, early_stop=True):
    R = survivals.shape[0]
    lengths = torch.zeros(R, dtype=torch.long)
    if R == 0:
        return lengths
    rates = path_rates(survivals, profile)
    best = 0
    for n in range(1, len(rates)):
        if rates[n] > rates[best]:
            best = n
        elif early_stop:
            break
    for r, _ in greedy_path(survivals)[:best].tolist():
        lengths[r] += 1
    return lengths
