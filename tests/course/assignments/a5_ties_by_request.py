"""Bug: equal survivals go to the lower request first, then the earlier position.
Caught by `greedy_path_ties_go_to_the_earlier_position`."""

from __future__ import annotations

import a5_solution
import torch
from a5_solution import prefix_survival  # noqa: F401


def greedy_path(survivals):
    R, gamma = survivals.shape
    candidates = [(r, j) for r in range(R) for j in range(gamma)]
    candidates.sort(key=lambda rj: (-float(survivals[rj]), rj[0], rj[1]))  # BUG: request before position
    return torch.tensor(candidates, dtype=torch.long).view(-1, 2)


a5_solution.greedy_path = greedy_path  # path_rates and prefix_schedule walk this path
path_rates, prefix_schedule = a5_solution.path_rates, a5_solution.prefix_schedule
