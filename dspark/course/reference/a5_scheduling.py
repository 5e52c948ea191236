"""Reference solution of assignment 5 (Algorithm 1), built on dspark/scheduler.py.

`prefix_survival`, `greedy_path` and `prefix_schedule` are the project's; `path_rates`
evaluates `expected_rate` at every prefix of the greedy path (DESIGN §5).
What this file does not do: anything beyond adapting signatures.
"""

from __future__ import annotations

import torch

from dspark import scheduler
from dspark.scheduler import ThroughputProfile


def prefix_survival(confidences: torch.Tensor) -> torch.Tensor:
    return scheduler.prefix_survival(confidences)


def greedy_path(survivals: torch.Tensor) -> torch.Tensor:
    return scheduler.greedy_path(survivals)


def path_rates(survivals: torch.Tensor, profile: ThroughputProfile) -> list[float]:
    R, _ = survivals.shape
    path = scheduler.greedy_path(survivals)
    rates = []
    for n in range(len(path) + 1):
        lengths = torch.zeros(R, dtype=torch.long).index_add_(0, path[:n, 0], torch.ones(n, dtype=torch.long))
        rates.append(scheduler.expected_rate(survivals, lengths, profile))
    return rates


def prefix_schedule(
    survivals: torch.Tensor, profile: ThroughputProfile, early_stop: bool = True
) -> torch.Tensor:
    return scheduler.prefix_schedule(survivals, profile, early_stop=early_stop)
