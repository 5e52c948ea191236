"""The vocabulary of the math word-problem generator: names, units, the step recorder and the template registry.

`_Work` records a solution one sentence and one exact equation at a time (it refuses an inexact division rather
than round); `_template(name)` registers a template function `rng -> (question, _Work)`. The templates
themselves are in math_money.py and math_quantities.py; math_problems.py draws from them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

_FEMALE = (
    "Maya", "Emma", "Olivia", "Ava", "Sofia", "Mia", "Lena", "Priya", "Aisha",
    "Grace", "Chloe", "Nora", "Zara", "Hana", "Lucy", "Ruth", "Elena", "Fatima",
    "Ines", "Yuki",
)  # fmt: skip
_MALE = (
    "Liam", "Noah", "Omar", "Ravi", "Ethan", "Lucas", "Mateo", "Kenji", "Samuel",
    "Diego", "Felix", "Hugo", "Jonah", "Arjun", "Tom", "Ben", "Marco", "Ivan",
    "Kofi", "Leo",
)  # fmt: skip


class _Person(NamedTuple):
    name: str
    subj: str  # she / he
    obj: str  # her / him
    poss: str  # her / his
    refl: str  # herself / himself

    @property
    def cap(self) -> str:
        """The subject pronoun capitalised, for the start of a sentence."""
        return self.subj.capitalize()


def _person(rng: random.Random, exclude: tuple[str, ...] = ()) -> _Person:
    """A random person whose name is not in `exclude`."""
    while True:
        if rng.random() < 0.5:
            person = _Person(rng.choice(_FEMALE), "she", "her", "her", "herself")
        else:
            person = _Person(rng.choice(_MALE), "he", "him", "his", "himself")
        if person.name not in exclude:
            return person


def _apply(a: int, op: str, b: int) -> int:
    """Evaluate `a op b`, refusing anything that would leave the integers >= 0."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        if b > a:
            raise ValueError(f"negative result: {a} - {b}")
        return a - b
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"inexact division: {a} / {b}")
        return a // b
    raise ValueError(f"unknown operator {op!r}")


def _singular(unit: str) -> str:
    """'1 dollars left' -> '1 dollar left': singularise the unit's first plural."""
    words = unit.split(" ")
    for i, word in enumerate(words):
        if word.endswith("ies"):
            words[i] = word[:-3] + "y"
        elif word.endswith(("oes", "xes")):
            words[i] = word[:-2]
        elif word.endswith("s"):
            words[i] = word[:-1]
        else:
            continue
        break
    return " ".join(words)


class _Work:
    """Collects solution lines; each step is one sentence with one equation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.last = 0

    def step(self, text: str, a: int, op: str, b: int, unit: str = "") -> int:
        """Append "<text> a op b = c <unit>." and return c."""
        c = _apply(a, op, b)
        tail = f" {_singular(unit) if c == 1 else unit}" if unit else ""
        self.lines.append(f"{text} {a} {op} {b} = {c}{tail}.")
        self.last = c
        return c

    def solution(self) -> str:
        """All step lines plus the answer line (the last step's result)."""
        return "\n".join([*self.lines, f"The answer is {self.last}."])


_Template = Callable[[random.Random], tuple[str, _Work]]
_REGISTRY: dict[str, _Template] = {}


def _template(name: str) -> Callable[[_Template], _Template]:
    def register(fn: _Template) -> _Template:
        _REGISTRY[name] = fn
        return fn

    return register


def _join(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
