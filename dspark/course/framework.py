"""The grading framework: `grade` runs an assignment's checks on a student's file and returns the report.

A `Check` is a name, a number of points and a function that receives the student's solution
and raises `CheckFailed("what is wrong")` when an answer is wrong (the helpers
`expect_tensor`, `expect_equal`, `expect_close`, `expect_number` write those messages). An
`Assignment` is a numbered list of checks plus where its starter and its reference solution live.

`grade(assignment, path)` runs every check's function here, in the grader's process, and none
of the student's code. Each check gets a fresh `CheckProcess` that imports the file and runs
the student's functions; the check calls them through its `Solution` --
`function(solution, "verify")(...)` -- which pickles the arguments to that process and gets
the value back as plain data, so the comparisons run here, where the student's code cannot
patch them, and no channel it can reach carries a verdict. A check ends as

  * PASS;
  * FAIL with the check's one-line reason (NaN and inf never pass: `expect_tensor` refuses
    non-finite floating tensors and `expect_number` non-finite numbers);
  * FAIL "not implemented" when the student's code raised NotImplementedError;
  * FAIL "crashed: ExcType: message (file.py:line in function)" for any other exception, and
    "crashed: the check's process died without a reply (exit status 3)" when it died (os._exit,
    a segfault, a kill), or "... sent back garbage" when what it sent is not a reply;
  * FAIL "timed out after Ns";
  * FAIL "uses the instructor's reference solution (...)" when the file is a copy of a reference
    solution (comments and layout aside) or imports dspark.course.reference: found in its source
    before anything runs (then every check fails); or when the reference was seen being imported,
    or one of its files being read, while the check ran (that check fails).

However the check ends, its process and every process it started are killed, also those that
moved to a session or process group of their own (on Linux; sandbox.py says how).

This file holds `grade`, `run_check` and the report (`CheckResult`, `Report`); the rest is one
file per part, each importing only those listed above it, and every public name of them is
re-exported here, so a checks module (dspark/course/a*.py) imports from this file alone:

  plain_data.py       what crosses the pipes: a `Call` in, a reply out, read as plain data only
  expect.py           `CheckFailed` and the expect_* helpers; one-line, printable messages
  reference_guard.py  the reference solution found in the source (copied or imported), or seen
                      being imported or read
  sandbox.py          the check's process: a supervisor in a new session, a scratch folder, the
                      student's file imported, calls served; every process below the supervisor
                      found (psutil) and killed
  check_process.py    `CheckProcess`, the grader's handle on it: deadline, replies checked, kill
  checks.py           `Check`, `CheckList`, `Assignment`; `Solution` and `Function`, through
                      which a check calls the student's code

Grading needs os.fork (Linux, macOS; on Windows, WSL).

What this cannot stop, running as the grader's own user (a container can, see
walkthrough/assignments/INSTRUCTORS.md): code that finds the grader's process (through /proc)
and signals it or writes to its terminal, that reads or deletes files by absolute path, that
kills its supervisor and then orphans a process (re-parented to init, out of reach), that has
another service start a process (cron, at, systemd-run), or, off Linux, that starts a process
which leaves the session with setsid(). What this file does not do: define checks
(dspark/course/a*.py) or parse a command line (dspark/course/command.py).
"""

from __future__ import annotations

import importlib.machinery
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dspark.course.check_process import MAX_REPLY_BYTES, CheckProcess, ProcessEnded, TimedOut, read_output
from dspark.course.checks import (
    ASSIGNMENTS_DIR,
    REPO_ROOT,
    Assignment,
    Check,
    CheckList,
    Function,
    Solution,
    StudentRaised,
    function,
)
from dspark.course.expect import (
    CheckFailed,
    expect_close,
    expect_equal,
    expect_number,
    expect_tensor,
    kind,
    number,
    one_line,
    printable,
    show,
)
from dspark.course.plain_data import (
    DTYPES,
    MAX_DEPTH,
    NOT_PLAIN,
    TENSOR,
    BadReply,
    Call,
    NotPlainData,
    Probe,
    decode_reply,
    encode_reply,
    from_plain,
    to_plain,
)
from dspark.course.reference_guard import (
    REFERENCE_DIR,
    REFERENCE_PACKAGE,
    STUDENT_MODULE,
    ReferenceWatch,
    code_tokens,
    inside,
    is_reference,
    reference_copy,
    reference_flag,
    reference_imports,
    reference_used,
)
from dspark.course.sandbox import (
    MAX_OUTPUT_BYTES,
    SWEEP_SECONDS,
    Job,
    become_subreaper,
    descendants,
    import_solution,
    kill_tree,
)

__all__ = [  # this file's names, then those it re-exports, file by file
    "DEFAULT_TIMEOUT", "MAX_TIMEOUT", "SolutionError", "CheckResult", "Report", "run_check", "check_timeout",
    "check_solution_file", "check_imports", "grade",
    "MAX_DEPTH", "NOT_PLAIN", "TENSOR", "DTYPES", "BadReply", "NotPlainData", "Probe", "Call", "to_plain",
    "from_plain", "encode_reply", "decode_reply",
    "CheckFailed", "one_line", "printable", "show", "kind", "number", "expect_tensor", "expect_number",
    "expect_equal", "expect_close",
    "STUDENT_MODULE", "REFERENCE_PACKAGE", "REFERENCE_DIR", "is_reference", "inside", "reference_imports",
    "code_tokens", "reference_copy", "reference_flag", "ReferenceWatch", "reference_used",
    "MAX_OUTPUT_BYTES", "SWEEP_SECONDS", "Job", "import_solution", "become_subreaper", "descendants",
    "kill_tree",
    "MAX_REPLY_BYTES", "TimedOut", "ProcessEnded", "CheckProcess", "read_output",
    "REPO_ROOT", "ASSIGNMENTS_DIR", "Check", "CheckList", "Assignment", "StudentRaised", "Solution",
    "Function", "function",
]  # fmt: skip

DEFAULT_TIMEOUT = 60.0  # seconds per check: generous, an honest check takes well under 5 s
MAX_TIMEOUT = 3600.0  # the most --timeout may be


class SolutionError(Exception):
    """The solution file cannot be graded at all (it does not import); the message says why."""


@dataclass
class CheckResult:
    name: str
    points: int
    passed: bool
    detail: str = ""  # why it failed: a reason, "not implemented", "crashed: ...", "timed out after Ns"
    output: str = ""  # what the student's code printed while the check ran (its last lines, made printable)

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0

    def line(self) -> str:
        tag = "PASS" if self.passed else "FAIL"
        text = f"{tag}  {self.earned:>2}/{self.points:<2} {self.name}"
        return text if self.passed else f"{text}: {self.detail}"


@dataclass
class Report:
    assignment: Assignment
    results: list[CheckResult] = field(default_factory=list)

    @property
    def score(self) -> int:
        return sum(r.earned for r in self.results)

    @property
    def total(self) -> int:
        return sum(r.points for r in self.results)


# ---- running ------------------------------------------------------------------------------------------
def _verdict(run: Callable[[], None], timeout: float) -> tuple[bool, str]:
    try:
        run()
    except CheckFailed as exc:
        return False, one_line(str(exc))
    except StudentRaised as exc:
        return False, exc.detail()
    except TimedOut:
        return False, f"timed out after {timeout:g}s"
    except (ProcessEnded, BadReply) as exc:
        return False, one_line(f"crashed: {exc}")
    except Exception as exc:  # noqa: BLE001 - values that break a check's own code fail that check
        message = f": {exc}" if str(exc) else ""
        return False, one_line(f"crashed: {type(exc).__name__}{message}")
    return True, ""


def _in_grader(check: Check, solution: Solution) -> None:
    """Run the check's own code here as the student's runs there -- one torch thread (many small
    tensor operations: more threads only wait on each other), gradients off, a fixed seed -- and
    leave this process's thread count and RNG as they were."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.default_generator.manual_seed(0)
            check.run(solution)
    finally:
        torch.set_num_threads(threads)


def run_check(check: Check, path: Path, timeout: float, flag: str = "") -> CheckResult:
    """One check on the solution at `path`, in its own process; `flag` fails it without running it."""
    if flag:
        return CheckResult(check.name, check.points, False, flag)
    with CheckProcess(path, timeout) as process:
        passed, detail = _verdict(lambda: _in_grader(check, Solution(process)), timeout)
    if (process.reference or process.reference_files) and not inside(path, REFERENCE_DIR):
        passed, detail = False, reference_used(process.reference, process.reference_files)
    return CheckResult(check.name, check.points, passed, detail, process.output)


def check_timeout(timeout: float) -> None:
    """ValueError unless `timeout` is a number of seconds in (0, MAX_TIMEOUT]."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise ValueError(
            f"the timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds, got {timeout!r}"
        )


def check_solution_file(path: Path) -> None:
    """Raise SolutionError unless `path` is a file Python can import: one ending in .py."""
    path = Path(path)
    if path.is_dir():
        raise SolutionError(f"{path} is a folder, not a Python file (.py)")
    if not path.is_file():
        raise SolutionError(f"no solution file at {path}")
    if path.suffix not in importlib.machinery.SOURCE_SUFFIXES:
        raise SolutionError(f"{path} is not a Python file (.py)")


def check_imports(path: Path, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Raise SolutionError unless the file is a .py file that imports within `timeout` seconds."""
    check_solution_file(path)
    path = Path(path).resolve()
    check_timeout(timeout)
    _need_fork()
    with CheckProcess(path, timeout) as process:
        ok, detail = _verdict(lambda: Solution(process).imported(), timeout)
    if not ok:
        raise SolutionError(f"cannot import {path.name}: {detail.removeprefix('crashed: ')}")


def _need_fork() -> None:
    if not hasattr(os, "fork"):
        raise SolutionError("grading needs os.fork: Linux or macOS (on Windows, use WSL)")


def grade(
    assignment: Assignment,
    path: Path,
    timeout: float = DEFAULT_TIMEOUT,
    only: Iterable[str] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
    check_import: bool = True,
) -> Report:
    """Run the assignment's checks (or those named in `only`) on the solution at `path`; first
    make sure it imports (SolutionError otherwise) unless the caller did (`check_import=False`)."""
    path = Path(path).resolve()
    check_timeout(timeout)
    _need_fork()
    if check_import:
        check_imports(path, timeout)
    flag = reference_flag(path)
    wanted = set(only) if only is not None else None
    report = Report(assignment)
    for check in assignment.checks:
        if wanted is not None and check.name not in wanted:
            continue
        result = run_check(check, path, timeout, flag)
        report.results.append(result)
        if on_result is not None:
            on_result(result)
    return report
