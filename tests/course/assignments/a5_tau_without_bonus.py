"""Bug: τ counts only the accepted drafts, forgetting the bonus/correction token every request
yields (τ starts at 0 instead of R). Caught by `theta_along_the_path_appendix_a`."""

from __future__ import annotations

import a5_solution
from a5_solution import greedy_path, prefix_survival  # noqa: F401


def path_rates(survivals, profile):
    R = survivals.shape[0]
    tau, rates = 0.0, [0.0]  # BUG: the R bonus tokens are missing from τ
    for n, (r, j) in enumerate(greedy_path(survivals).tolist(), start=1):
        tau += float(survivals[r, j])
        rates.append(tau * profile.sps(R + n))
    return rates


a5_solution.path_rates = path_rates  # prefix_schedule uses it
prefix_schedule = a5_solution.prefix_schedule
