"""Grade a course assignment (walkthrough/assignments/) on this machine, in minutes, on the CPU.

    python -m dspark.grade N                    # the untouched starter in walkthrough/assignments
    python -m dspark.grade N my_solution.py     # your file
    python -m dspark.grade N --reference        # the instructor's solution (the project's own code)
    python -m dspark.grade --list               # the assignments, one per line

Every check runs the solution in a process of its own, in a scratch folder, with a time
limit (--timeout, seconds, at most 3600), so a solution that crashes, hangs or kills its
process loses that check's points and nothing else; the verdict is reached here, from the
values the solution returned. When a check ends -- returned, timed out or crashed -- its
process and every process it started are killed, also those that moved to a session or
process group of their own (on Linux; what still escapes -- a process orphaned after the
solution killed its check's supervisor, one another service starts, and off Linux any that
leaves the process group -- is listed in walkthrough/assignments/INSTRUCTORS.md). The report
has one line per check -- PASS, or FAIL with the reason ("not implemented", "crashed: ...",
"timed out after Ns", "uses the instructor's reference solution ..." for a file that is a
copy of it (comments and layout aside), imports it or reads its files, or what is wrong) --
with what the solution printed under it, each line behind a `|`, and ends with
`score: X/Y`, which only this command writes. The exit status is 0 whenever grading
worked, whatever the score; a bad assignment number, a missing file, a path that is not a
.py file, a bad --timeout or a file that does not import is one line on stderr and status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.course.catalog import ASSIGNMENTS, get_assignment
from dspark.course.framework import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    CheckResult,
    SolutionError,
    check_imports,
    grade,
)
from dspark.lab.cli import UsageError, number

OUTPUT_PREFIX = "      | "  # before each line the solution printed: never mistaken for the report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print its usage over several lines
        raise UsageError(f"{message} (python -m dspark.grade --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m dspark.grade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("assignment", nargs="?", help="assignment number (see --list)")
    parser.add_argument("solution", nargs="?", help="your solution file (default: the untouched starter)")
    parser.add_argument("--reference", action="store_true", help="grade the instructor's reference solution")
    parser.add_argument("--list", action="store_true", help="print the assignment numbers and titles")
    parser.add_argument("--check", action="append", metavar="NAME", help="run only this check (repeatable)")
    parser.add_argument(
        "--timeout",
        type=number(float, 0.0, MAX_TIMEOUT),
        default=DEFAULT_TIMEOUT,
        help=f"seconds each check may run, at most {MAX_TIMEOUT:g} (default: %(default)g)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # options may come before or after the positionals
    if args.list:
        for number, assignment in sorted(ASSIGNMENTS.items()):
            print(f"{number}  {assignment.title}")
        return 0
    if args.assignment is None:
        raise UsageError("which assignment? python -m dspark.grade N [solution.py] (--list names them)")
    try:
        number = int(args.assignment)
    except ValueError:
        raise UsageError(
            f"the assignment must be a number, got {args.assignment!r} (--list names them)"
        ) from None
    assignment = get_assignment(number)
    if args.reference and args.solution:
        raise UsageError("give a solution file or --reference, not both")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    names = {c.name for c in assignment.checks}
    unknown = sorted(set(args.check or ()) - names)
    if unknown:
        raise UsageError(
            f"assignment {number} has no check {', '.join(unknown)}; its checks: {', '.join(sorted(names))}"
        )
    path = assignment.reference_path if args.reference else Path(args.solution or assignment.starter_path)
    try:
        check_imports(path, args.timeout)  # also: a missing file, a folder, a file that is not .py
    except SolutionError as exc:
        raise UsageError(str(exc)) from None
    shown = path.resolve().relative_to(Path.cwd()) if path.resolve().is_relative_to(Path.cwd()) else path
    print(f"assignment {number}: {assignment.title} -- grading {shown}", flush=True)
    report = grade(assignment, path, args.timeout, args.check, print_result, check_import=False)
    print(f"score: {report.score}/{report.total}", flush=True)
    return 0


def print_result(result: CheckResult) -> None:
    """The check's line, then what the solution printed meanwhile, each line behind OUTPUT_PREFIX."""
    print("  " + result.line(), flush=True)
    for line in result.output.splitlines():
        print(OUTPUT_PREFIX + line, flush=True)
