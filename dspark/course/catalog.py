"""The course's assignments, by number (walkthrough/assignments/README.md lists them for students).

What this file does not do: define checks (dspark/course/a*.py) or run them (framework.py).
"""

from __future__ import annotations

from dspark.course import a1_verification, a2_round, a3_markov, a4_survival, a5_scheduling
from dspark.course.framework import Assignment

ASSIGNMENTS: dict[int, Assignment] = {
    module.ASSIGNMENT.number: module.ASSIGNMENT
    for module in (a1_verification, a2_round, a3_markov, a4_survival, a5_scheduling)
}


def get_assignment(number: int) -> Assignment:
    """Assignment `number`; ValueError naming the valid numbers otherwise."""
    if number not in ASSIGNMENTS:
        valid = ", ".join(str(n) for n in sorted(ASSIGNMENTS))
        raise ValueError(f"there is no assignment {number}; the assignments are {valid} (--list names them)")
    return ASSIGNMENTS[number]
