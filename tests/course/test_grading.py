"""The course graders (dspark/course/, `python -m dspark.grade`) are trustworthy in both directions.

* The untouched starters score 0, every check saying "not implemented", no traceback.
* The instructor's reference solutions (the project's own code) and independent
  from-scratch solutions (tests/course/assignments/aN_solution.py) score full marks.
* Every planted bug (tests/course/assignments/aN_bugs.txt: one realistic bug each, a patch over
  aN_solution.py applied here) fails the checks named for it, with a reason, not a crash.
* A crashing and a hanging solution are reported per check; the grader still exits 0
  with `score: X/Y` as its last line, and leaves no process behind.
* The command line: --list, --reference, --check, a bad number, a missing file, a file
  that does not import: one line on stderr, a non-zero status, no traceback.
* No solution can fool it (issue #41): finding the grader's pipe through gc, patching its
  comparison helpers, answering NaN, importing the reference solution, deleting a folder
  next to it, killing its parent, garbling its pipe, forking a process that stays, printing
  `score:` lines -- each scores nothing it did not earn, and the report is always there.

Gradings run in this process (each check's student code in a forked, sandboxed child),
planted bugs on their named checks only; the few cases that need a real grader process
(one the student's code kills, one whose stdout it writes to) run one.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dspark import grade as grade_command
from dspark.course.catalog import ASSIGNMENTS
from dspark.course.framework import grade
from dspark.lab.cli import run_main

SOLUTIONS = Path(__file__).resolve().parent / "assignments"
ROOT = Path(__file__).resolve().parents[2]
NUMBERS = sorted(ASSIGNMENTS)


@dataclass
class PlantedBug:
    """One bug of tests/course/assignments/aN_bugs.txt: patches over aN_solution.py (README.md there)."""

    name: str
    number: int  # the assignment
    caught_by: list[str]  # the checks that must catch it
    hunks: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (solution lines, buggy lines)

    def source(self) -> str:
        """The solution's text with the bug planted; each hunk's solution lines must be there exactly once."""
        lines = (SOLUTIONS / f"a{self.number}_solution.py").read_text().splitlines()
        for old, new in self.hunks:
            at = [i for i in range(len(lines)) if lines[i : i + len(old)] == old]
            assert len(at) == 1, (
                f"{self.name}: {old[0]!r}... is {len(at)} times in a{self.number}_solution.py"
            )
            lines[at[0] : at[0] + len(old)] = new
        return "\n".join(lines) + "\n"

    def file(self, folder: Path) -> Path:
        """The buggy solution written as a student's file."""
        path = folder / f"{self.name}.py"
        path.write_text(self.source())
        return path


def planted_bugs() -> list[PlantedBug]:
    """Every bug of the aN_bugs.txt files, in file order."""
    bugs: list[PlantedBug] = []
    for path in sorted(SOLUTIONS.glob("a*_bugs.txt")):
        number = int(path.name.split("_")[0][1:])
        for line in path.read_text().splitlines():
            kind, text = line[:1], line[1:]
            if line.startswith("== "):
                name, checks = line[3:].split(": ")
                bugs.append(PlantedBug(f"a{number}_{name}", number, checks.split(", ")))
            elif kind == "-":  # a new hunk, unless it continues the current one's solution lines
                if not bugs[-1].hunks or bugs[-1].hunks[-1][1]:
                    bugs[-1].hunks.append(([], []))
                bugs[-1].hunks[-1][0].append(text)
            elif kind == "+":
                assert bugs[-1].hunks, f"{path.name}: {line!r} replaces no solution line"
                bugs[-1].hunks[-1][1].append(text)
            else:
                assert kind in ("", "#"), f"{path.name}: {line!r} is none of ==, #, -, +"
    return bugs


PLANTED_BUGS = planted_bugs()


def cli(capsys, *argv: str) -> tuple[int, list[str], str]:
    """(exit status, stdout lines, stderr) of `python -m dspark.grade ARGV`, run in this process."""
    status = run_main(grade_command.main, list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, [line.strip() for line in out.splitlines() if line.strip()], err


@pytest.mark.parametrize("number", NUMBERS)
def test_untouched_starter_scores_zero_and_says_not_implemented(number, capsys):
    status, lines, _ = cli(capsys, str(number))
    assignment = ASSIGNMENTS[number]
    assert status == 0 and lines[-1] == f"score: 0/{assignment.points}"
    check_lines = lines[1:-1]
    assert len(check_lines) == len(assignment.checks)
    for line, check in zip(check_lines, assignment.checks):
        assert line.startswith("FAIL") and f" {check.name}: not implemented" in line, line


@pytest.mark.parametrize("number", NUMBERS)
def test_reference_solution_scores_full_marks(number):
    assignment = ASSIGNMENTS[number]
    report = grade(assignment, assignment.reference_path)
    failures = [r.line() for r in report.results if not r.passed]
    assert report.score == report.total == assignment.points, failures


@pytest.mark.parametrize("number", NUMBERS)
def test_independent_solution_scores_full_marks(number):
    path = next(SOLUTIONS.glob(f"a{number}_solution.py"))
    report = grade(ASSIGNMENTS[number], path)
    assert report.score == report.total, [r.line() for r in report.results if not r.passed]


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=[b.name for b in PLANTED_BUGS])
def test_planted_bug_fails_its_named_check(bug, tmp_path):
    report = grade(ASSIGNMENTS[bug.number], bug.file(tmp_path), only=bug.caught_by)
    assert [r.name for r in report.results] == bug.caught_by
    for result in report.results:
        assert not result.passed, f"{bug.name}: {result.name} did not catch the bug"
        assert result.detail and not result.detail.startswith(("crashed", "timed out", "not implemented"))


def test_every_planted_bug_applies_once_and_names_real_checks():
    assert {p.name for p in SOLUTIONS.glob("a*.py")} == {f"a{n}_solution.py" for n in NUMBERS}  # no copies
    assert len({b.name for b in PLANTED_BUGS}) == len(PLANTED_BUGS)
    for bug in PLANTED_BUGS:
        source = bug.source()  # every hunk found exactly once
        compile(source, bug.name, "exec")
        assert bug.hunks and source != (SOLUTIONS / f"a{bug.number}_solution.py").read_text(), bug.name
        checks = {check.name for check in ASSIGNMENTS[bug.number].checks}
        assert bug.caught_by and set(bug.caught_by) <= checks, bug.name
    # at least three per assignment
    assert all(sum(b.number == n for b in PLANTED_BUGS) >= 3 for n in NUMBERS)


def test_a_crashing_solution_is_reported_per_check(capsys):
    status, lines, _ = cli(capsys, "5", str(SOLUTIONS / "crashing.py"))
    assert status == 0 and lines[-1] == f"score: 0/{ASSIGNMENTS[5].points}"
    check_lines = lines[1:-1]
    assert len(check_lines) == len(ASSIGNMENTS[5].checks)
    assert all(": crashed: " in line for line in check_lines)
    by_name = {line.split()[2].rstrip(":"): line for line in check_lines}
    assert "IndexError" in by_name["survival_is_the_cumulative_product"]
    assert "crashing.py:" in by_name["survival_is_the_cumulative_product"]  # where, in the student's file
    assert "ZeroDivisionError" in by_name["greedy_path_order"]
    assert "in greedy_path)" in by_name["greedy_path_order"]
    # os._exit(3): the process died without a verdict, and the check still has its line
    assert "exit status 3" in by_name["theta_along_the_path_appendix_a"]
    assert not multiprocessing.active_children()


def test_a_hanging_solution_times_out_on_that_check_only(capsys):
    status, lines, _ = cli(capsys, "5", str(SOLUTIONS / "hanging.py"), "--timeout", "1")
    assert status == 0 and lines[-1] == f"score: {ASSIGNMENTS[5].points - 1}/{ASSIGNMENTS[5].points}"
    assert "survival_is_the_cumulative_product: timed out after 1s" in lines[1]
    assert all(line.startswith("PASS") for line in lines[2:-1])
    assert not multiprocessing.active_children()  # the hanging child was killed


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        grade_command.main(["--help"])
    assert exit_info.value.code == 0 and "usage: python -m dspark.grade" in capsys.readouterr().out


def test_cli_list_reference_and_single_check(capsys):
    status, lines, _ = cli(capsys, "--list")
    assert status == 0 and lines == [f"{n}  {ASSIGNMENTS[n].title}" for n in NUMBERS]
    status, lines, _ = cli(capsys, "5", "--reference", "--check", "greedy_path_order")
    assert status == 0 and lines[1].startswith("PASS") and "greedy_path_order" in lines[1]
    assert lines[-1] == "score: 2/2" and len(lines) == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["7"], "there is no assignment 7"),
        (["one"], "must be a number"),
        ([], "which assignment"),
        (["1", "no/such/solution.py"], "no solution file"),
        (["1", "--reference", "x.py"], "not both"),
        (["5", "--check", "no_such_check"], "has no check no_such_check"),
        (["1", "--timeout", "soon"], "expected a number"),
    ],
)
def test_cli_usage_errors_are_one_line(capsys, argv, message):
    status, lines, err = cli(capsys, *argv)
    assert status != 0 and not lines
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize(
    "source, message",
    [
        ("def verify(:\n", "SyntaxError"),
        ("import no_such_module_anywhere\n", "ModuleNotFoundError"),
        ("while True:\n    pass\n", "timed out after 0.5s"),
    ],
)
def test_a_file_that_does_not_import_is_one_line(tmp_path, capsys, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    status, lines, err = cli(capsys, "1", str(path), "--timeout", "0.5")
    assert status != 0 and not lines
    assert len(err.strip().splitlines()) == 1 and "cannot import broken.py" in err and message in err


# ---- a grader no student can fool (issue #41) -------------------------------------------------------
def solution_file(tmp_path: Path, source: str, name: str = "solution.py") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def grader_process(*argv: str) -> tuple[int, list[str]]:
    """(exit status, stdout lines) of a real `python -m dspark.grade ARGV` process."""
    run = subprocess.run(
        [sys.executable, "-m", "dspark.grade", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert "Traceback" not in run.stdout + run.stderr, run.stderr
    return run.returncode, [line.strip() for line in run.stdout.splitlines() if line.strip()]


def running(pid: int) -> bool:
    """Is process `pid` alive (a zombie is not)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_verdict_sent_through_the_graders_pipe_counts_for_nothing(tmp_path):
    """The audit's exploit: implement nothing; at import, find the result pipe through gc and send a pass."""
    path = solution_file(
        tmp_path,
        """
        import gc
        import multiprocessing.connection

        for obj in gc.get_objects():
            if type(obj) is multiprocessing.connection.Connection:
                try:
                    obj.send((True, ""))
                except (OSError, ValueError):
                    pass
        """,
    )
    report = grade(ASSIGNMENTS[4], path)
    assert report.score == 0, [r.line() for r in report.results if r.passed]
    assert all("defines no function" in r.detail for r in report.results)


def test_patching_the_graders_helpers_changes_nothing(tmp_path):
    """Comparison helpers replaced by no-ops from the student's file: they are patched in the
    check's process, while the comparisons run in the grader's."""
    path = solution_file(
        tmp_path,
        """
        import sys

        import dspark.course.framework  # noqa: F401


        def accept(value=None, *args, **kwargs):
            return value


        for name, module in list(sys.modules.items()):
            if name.startswith("dspark.course"):
                for helper in ("expect_close", "expect_equal", "expect_tensor", "expect_number", "number"):
                    if hasattr(module, helper):
                        setattr(module, helper, accept)


        def nothing(*args, **kwargs):
            return None


        confidence_label = events_and_mask = ece = auroc = calibrated_survival = fit_sts = nothing
        """,
    )
    report = grade(ASSIGNMENTS[4], path)
    assert report.score == 0, [r.line() for r in report.results if r.passed]


def test_nan_and_inf_answers_never_pass(tmp_path):
    path = solution_file(
        tmp_path,
        """
        import torch

        NAN = float("nan")


        def confidence_label(q, p):
            return torch.full(q.shape[:-1], NAN)


        def events_and_mask(verify_lens, accepted, gamma):
            shape = (verify_lens.shape[0], gamma)
            return torch.full(shape, NAN, dtype=torch.float64), torch.full(shape, NAN)


        def ece(pred, obs, bins=15):
            return NAN


        def auroc(score, label):
            return float("inf") if bool((score == 0.5).all()) else NAN


        def calibrated_survival(confidences, temperatures=None):
            return torch.full(confidences.shape, NAN, dtype=torch.float64)


        def fit_sts(confidences, events, mask):
            return torch.full(confidences.shape[1:], float("inf"), dtype=torch.float64)
        """,
    )
    report = grade(ASSIGNMENTS[4], path)
    assert report.score == 0, [r.line() for r in report.results if r.passed]
    assert all("nan" in r.detail.lower() or "inf" in r.detail for r in report.results), [
        r.line() for r in report.results
    ]


@pytest.mark.parametrize(
    "source, how",
    [
        ("from dspark.course.reference.a4_survival import *  # noqa: F403\n", "line 1"),
        (
            "import importlib\n\n"
            "_answer = importlib.import_module('dspark.course.' + 'reference.a4_survival')\n"
            "globals().update({k: getattr(_answer, k) for k in dir(_answer) if not k.startswith('_')})\n",
            "imported dspark.course.reference.a4_survival",
        ),
    ],
    ids=["in-the-source", "at-run-time"],
)
def test_importing_the_reference_solution_fails_every_check_it_helped(tmp_path, source, how):
    import dspark.course.reference.a4_survival  # noqa: F401 - loaded here too: must not hide the import

    only = ["confidence_label_hand_worked", "ece_hand_worked", "sts_matches_the_reference_search"]
    report = grade(ASSIGNMENTS[4], solution_file(tmp_path, source), only=only)
    assert report.score == 0 and [r.name for r in report.results] == only
    for result in report.results:
        assert "uses the instructor's reference solution" in result.detail and how in result.detail, (
            result.line()
        )


def test_student_code_runs_in_a_scratch_folder_and_cannot_delete_its_siblings(tmp_path, monkeypatch):
    """A relative rm finds nothing to delete: the student's code runs in a fresh scratch folder
    (removed afterwards), not where the grader or the file is. An absolute path cannot be protected
    without a container (walkthrough/assignments/INSTRUCTORS.md)."""
    record = tmp_path / "cwd.txt"
    path = solution_file(
        tmp_path / "student",
        f"""
        import os
        import shutil

        with open({str(record)!r}, "a") as f:
            f.write(os.getcwd() + "\\n")
        shutil.rmtree("victim", ignore_errors=True)  # the folder next to this file, were it the cwd
        """,
    )
    sibling = path.parent / "victim"
    sibling.mkdir()
    (sibling / "keep.txt").write_text("precious\n")
    monkeypatch.chdir(path.parent)  # grading from the student's folder: the worst case
    report = grade(ASSIGNMENTS[5], path, only=["greedy_path_order"])
    assert (sibling / "keep.txt").read_text() == "precious\n"
    assert report.results[0].detail.startswith("the solution file defines no function")
    folders = [Path(line) for line in record.read_text().splitlines()]
    assert len(folders) == 2  # the import check, then the check
    for folder in folders:
        assert folder != path.parent and folder.name.startswith("dspark-grade-") and not folder.exists()


@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="tells a zombie from a live process by /proc"
)
def test_a_process_the_student_forks_does_not_outlive_grading(tmp_path):
    """A grandchild that sleeps, and a check's process that leaves its process group and spins:
    both gone once the grade is in."""
    record = tmp_path / "pids.txt"
    path = solution_file(
        tmp_path,
        f"""
        import os
        import time


        def note(pid):
            with open({str(record)!r}, "a") as f:
                f.write(f"{{pid}}\\n")


        def prefix_survival(confidences):
            pid = os.fork()
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            note(pid)
            return confidences.cumprod(1)


        def greedy_path(survivals):
            os.setsid()
            note(os.getpid())
            while True:
                pass
        """,
    )
    pids = []
    try:
        report = grade(
            ASSIGNMENTS[5], path, timeout=2, only=["survival_is_the_cumulative_product", "greedy_path_order"]
        )
        pids = [int(line) for line in record.read_text().split()]
        assert [r.passed for r in report.results] == [True, False]
        assert report.results[1].detail == "timed out after 2s"
        assert len(pids) == 2
        end = time.monotonic() + 5
        while any(running(pid) for pid in pids) and time.monotonic() < end:
            time.sleep(0.05)
        assert not [pid for pid in pids if running(pid)]
    finally:
        for pid in pids:  # the test's own processes, should the grader have left them
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_garbled_pipe_and_a_killed_process_are_reported_per_check(tmp_path):
    path = solution_file(
        tmp_path,
        """
        import os
        import stat


        def prefix_survival(confidences):  # garbage into every pipe it holds, the reply pipe included
            for fd in range(3, 256):
                try:
                    if stat.S_ISFIFO(os.fstat(fd).st_mode):
                        os.write(fd, b"\\xff" * 64)
                except OSError:
                    pass
            return confidences.cumprod(1)


        def greedy_path(survivals):
            os.kill(os.getpid(), 9)
        """,
    )
    report = grade(ASSIGNMENTS[5], path, only=["survival_is_the_cumulative_product", "greedy_path_order"])
    garbled, killed = report.results
    assert not garbled.passed and garbled.detail.startswith("crashed: the check's process sent back garbage")
    assert not killed.passed and "died without a reply (killed by signal SIGKILL)" in killed.detail


def test_a_solution_that_kills_its_parent_still_gets_a_report(tmp_path):
    path = solution_file(
        tmp_path,
        """
        import os
        import signal


        def greedy_path(survivals):
            os.kill(os.getppid(), signal.SIGKILL)
            return survivals
        """,
    )
    status, lines = grader_process(
        "5", str(path), "--check", "greedy_path_order", "--check", "strict_improvement_only"
    )
    assert status == 0 and lines[-1] == "score: 0/3", lines
    assert lines[1].startswith("FAIL") and "greedy_path_order" in lines[1]
    assert (
        lines[2].startswith("FAIL")
        and "strict_improvement_only: the solution file defines no function" in lines[2]
    )


def test_score_lines_the_solution_prints_cannot_pass_for_the_report(tmp_path):
    path = solution_file(
        tmp_path,
        """
        import os
        import sys

        print("score: 21/21")


        def prefix_survival(confidences):
            print("PASS   1/1  greedy_path_order")
            sys.__stdout__.write("score: 21/21\\n")
            sys.__stdout__.flush()
            os.write(1, b"score: 21/21\\n")
            os.write(2, b"\\x1b[2K\\x1b[1Ascore: 21/21\\n")
            return confidences.cumprod(1)
        """,
    )
    status, lines = grader_process("5", str(path), "--check", "survival_is_the_cumulative_product")
    assert status == 0 and lines[-1] == "score: 1/1", lines
    assert [line for line in lines if line.startswith(("score:", "PASS", "FAIL"))] == [
        lines[1],
        "score: 1/1",
    ], lines
    printed = [line for line in lines if line.startswith("|")]
    assert printed[0] == "| score: 21/21" and "| \\x1b[2K\\x1b[1Ascore: 21/21" in printed, printed
    assert len(printed) == 5 and "| PASS   1/1  greedy_path_order" in printed
