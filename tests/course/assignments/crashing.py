"""Assignment 5, crashing in every function (one of them kills its process): each check must
report "crashed: ..." and the grader must still finish with a score line and exit status 0."""

from __future__ import annotations

import os


def prefix_survival(confidences):
    return confidences.cumprod(dim=2)  # IndexError: the tensor has two dimensions


def greedy_path(survivals):
    order = []
    return order[len(survivals) // 0]  # ZeroDivisionError


def path_rates(survivals, profile):
    os._exit(3)  # the process dies without a word


def prefix_schedule(survivals, profile, early_stop=True):
    return greedy_path(survivals)
