"""What a checks module (dspark/course/a*.py) is written with: `Check`s, an `Assignment`, a `Solution`.

A `Check` is a name, a number of points and a function that receives the student's solution
and raises `CheckFailed` (dspark/course/expect.py) when an answer is wrong; `CheckList`
collects an assignment's checks in the order they are written (`@checks.add(points)`), and an
`Assignment` is those checks plus where its starter and its reference solution live. The
function calls the student's code through its `Solution` -- `function(solution, "verify")(...)`
-- which sends the call to the check's process (dspark/course/check_process.py) and returns
the value as plain data, so the comparisons run in the grader, where the student's code cannot
patch them; `StudentRaised` carries what the student's code raised there, and the `Probe`s
handed to it bring back what they recorded.

What this file does not do: define the checks of an assignment (dspark/course/a*.py) or run
them and write the report (dspark/course/framework.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark.course.check_process import CheckProcess
from dspark.course.expect import CheckFailed, one_line
from dspark.course.plain_data import Call, Probe

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS_DIR = REPO_ROOT / "walkthrough" / "assignments"


@dataclass(frozen=True)
class Check:
    name: str
    points: int
    run: Callable[[Solution], None]  # raises CheckFailed on a wrong answer


class CheckList:
    """Collects an assignment's checks in the order they are written: `@checks.add(points)`."""

    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, points: int) -> Callable[[Callable[[Solution], None]], Callable[[Solution], None]]:
        def register(fn: Callable[[Solution], None]) -> Callable[[Solution], None]:
            self.checks.append(Check(fn.__name__, points, fn))
            return fn

        return register


@dataclass(frozen=True)
class Assignment:
    number: int
    title: str
    folder: str  # walkthrough/assignments/<folder>: handout.md and starter.py
    checks: tuple[Check, ...]
    reference: str  # module of the reference adapter (dspark code behind the starter's signatures)

    @property
    def starter_path(self) -> Path:
        return ASSIGNMENTS_DIR / self.folder / "starter.py"

    @property
    def reference_path(self) -> Path:
        return Path(importlib.util.find_spec(self.reference).origin)

    @property
    def points(self) -> int:
        return sum(c.points for c in self.checks)


# ---- the student's functions, run in the check's process --------------------------------------------
class StudentRaised(Exception):
    """The student's code raised; `error` describes it (type, message, function, where)."""

    def __init__(self, error: dict) -> None:
        super().__init__(error["message"])
        self.error = error

    def detail(self) -> str:
        error = self.error
        if error.get("not_implemented") is True:
            return one_line("not implemented" + (f" ({error['function']})" if error["function"] else ""))
        message = f": {error['message']}" if error["message"] else ""
        return one_line(f"crashed: {error['type']}{message}") + (
            f" ({one_line(error['where'], 120)})" if error["where"] else ""
        )


class Solution:
    """The student's file as a check sees it. Its functions run in the check's process; what they
    return comes back as plain data, and the probes handed to them bring back what they recorded."""

    def __init__(self, process: CheckProcess) -> None:
        self.process = process

    def imported(self) -> None:
        """Wait until the file is imported; StudentRaised if importing it raised."""
        reply = self.process.start()
        if reply["kind"] == "raised":
            raise StudentRaised(reply["error"])

    def call(self, call: Call) -> tuple[Any, list | None]:
        """(value, the arguments after the call if asked for) of one call of the student's function."""
        self.imported()
        reply = self.process.call(call)
        if reply["kind"] == "missing":
            raise CheckFailed(
                f"the solution file defines no function `{call.name}` (keep the starter's names)"
            )
        if reply["kind"] == "raised":
            raise StudentRaised(reply["error"])
        for probe, log in zip(call.probes, reply["logs"]):
            try:
                probe.absorb_grading_log(log)
            except Exception:  # noqa: BLE001 - the student's code garbled what the test double recorded
                raise CheckFailed("what the check's test doubles recorded came back damaged") from None
        return reply["value"], reply.get("arguments")


@dataclass(frozen=True)
class Function:
    """One of the student's functions: call it like the function itself."""

    solution: Solution
    name: str
    probes: tuple[Probe, ...] = ()

    def __call__(self, *args, **kwargs) -> Any:
        return self.solution.call(Call(self.name, args, kwargs, self.probes))[0]

    def with_arguments(self, *args, **kwargs) -> tuple[Any, list]:
        """(value, the positional arguments as the call left them) -- for functions that write into them."""
        return self.solution.call(Call(self.name, args, kwargs, self.probes, return_arguments=True))

    def observing(self, *probes: Probe) -> Function:
        """This function, with `probes` (passed among its arguments) read back after every call."""
        return Function(self.solution, self.name, self.probes + probes)


def function(solution: Solution, name: str) -> Function:
    """The student's function `name` (a call fails clearly if the file does not define it)."""
    return Function(solution, name)
