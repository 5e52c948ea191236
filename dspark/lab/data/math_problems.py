"""Seeded, offline generator of grade-school multi-step math word problems.

Each problem is a short English question plus a worked solution: one line per
arithmetic step, each a plain sentence holding one explicit equation such as
``3 * 4 = 12``, followed by a final line ``The answer is N.``. About twenty
templates (shopping with change, sharing, speed and distance, recipes, savings,
areas, ages, unit conversions, trains, ...) are filled with random names, items
and numbers. Numbers are chosen so that every intermediate and final result is
a non-negative integer: every division is exact by construction, and `_Work`
refuses an inexact one rather than round.

This stands in for the paper's math evaluation domain (GSM8K / MATH style
problems) at our scale: a ~6M parameter model cannot learn GSM8K, but it can
learn this narrow, regular, step-by-step format, which is what makes the math
domain easy for a draft model to predict.

The names, units and step recorder are in math_words.py, the templates in math_money.py and
math_quantities.py; this file draws from them.

What this file does not do: it is not GSM8K and holds no real data set, it
downloads nothing, and it does not check answers written by a model (the
answer line is simply "The answer is N.", easy to parse if needed). Only the
standard library is used; everything is deterministic given the `random.Random`
state.
"""

from __future__ import annotations

import random

import dspark.lab.data.math_money  # noqa: F401 (registers its templates)
import dspark.lab.data.math_quantities  # noqa: F401
from dspark.lab.data.math_words import _REGISTRY

__all__ = ["TEMPLATES", "generate_problem", "generate_problems"]

# the draw order of the templates: fixed here (not the order the modules register them), so a seed gives the
# same problems however the template files are arranged
TEMPLATES: tuple[str, ...] = (
    "shopping_change",
    "sharing_equally",
    "speed_distance",
    "recipe_scaling",
    "savings_weeks",
    "rectangle_area_perimeter",
    "ages",
    "buying_packs",
    "percent_discount",
    "length_conversion",
    "time_conversion",
    "mass_conversion",
    "floor_tiles",
    "train_seats",
    "classroom_buses",
    "fruit_basket",
    "book_reading",
    "pizza_party",
    "hourly_wages",
    "garden_harvest",
)
assert set(TEMPLATES) == set(_REGISTRY), "a template is registered but not drawn, or drawn but not registered"


def generate_problem(rng: random.Random, template: str | None = None) -> tuple[str, str]:
    """Return one (question, solution) pair drawn with `rng`.

    `template` picks a template by name (see `TEMPLATES`); None draws one
    uniformly. The solution has one line per arithmetic step and ends with
    the line "The answer is N.". Deterministic given the rng state.
    """
    name = rng.choice(TEMPLATES) if template is None else template
    if name not in _REGISTRY:
        raise ValueError(f"unknown template {name!r}; expected one of {TEMPLATES}")
    question, work = _REGISTRY[name](rng)
    return question, work.solution()


def generate_problems(n: int, seed: int) -> list[tuple[str, str]]:
    """Return `n` (question, solution) pairs from `random.Random(seed)`."""
    rng = random.Random(seed)
    return [generate_problem(rng) for _ in range(n)]
