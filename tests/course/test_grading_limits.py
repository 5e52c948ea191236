"""The course grader (`python -m dspark.grade`) at the limits an audit probed.

* Orphans: a process the solution starts in a session of its own (`start_new_session=True`, or a
  double fork with `os.setsid()`) is killed when its check ends -- whether the check returned,
  timed out or crashed -- although `killpg` cannot reach it.
* The reference solution reused: a copy of it (comments, docstrings, blank lines and indentation
  aside) fails every check, and a solution that reads the reference file at run time (its path
  built so that no string in the source names it) fails the checks during which it did; grading
  the reference itself (`--reference`) stays full marks, unflagged.
* A solution path that is not a Python file (a .txt, a file without suffix, a folder): one clean
  line on stderr, exit status 2, no internal exception text.
"""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from dspark import grade as grade_command
from dspark.course.catalog import ASSIGNMENTS
from dspark.course.framework import SolutionError, grade
from dspark.lab.cli import run_main

REFERENCE_A5 = Path(ASSIGNMENTS[5].reference_path)
ON_PROC = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes through /proc")


def solution_file(tmp_path: Path, source: str, name: str = "solution.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def running(pid: int) -> bool:
    """Is process `pid` alive (a zombie is not)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def marked(marker: str) -> list[int]:
    """The live processes with `marker` among their arguments."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv and running(int(entry.name)):
            found.append(int(entry.name))
    return found


# ---- orphans -----------------------------------------------------------------------------------------
SPAWNERS = {
    "new-session": """
        def spawn():
            subprocess.Popen(SLEEPER, start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    """,
    "double-fork-setsid": """
        def spawn():
            done, hold = os.pipe()  # close-on-exec: EOF once the grandchild runs the sleeper
            child = os.fork()
            if child == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, SLEEPER)
                os._exit(0)
            os.close(hold)
            os.read(done, 1)
            os.close(done)
            os.waitpid(child, 0)
    """,
}


ENDINGS = """
    def prefix_survival(confidences):  # returns
        spawn()
        return confidences.cumprod(1)


    def greedy_path(survivals):  # hangs
        spawn()
        while True:
            pass


    def path_rates(survivals, profile):  # dies
        spawn()
        os._exit(3)
"""


@ON_PROC
@pytest.mark.parametrize("how", sorted(SPAWNERS))
def test_processes_started_in_a_new_session_do_not_outlive_their_check(tmp_path, how):
    """Each function starts a `sleep 300` in a session of its own, then returns, hangs or dies;
    once the grade is in, none of those sleepers is left."""
    marker = f"dspark-orphan-{uuid.uuid4().hex}"
    prelude = f"""
        import os
        import subprocess
        import sys

        SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)", {marker!r}]
    """
    source = "\n".join(textwrap.dedent(part) for part in (prelude, SPAWNERS[how], ENDINGS))
    only = ["survival_is_the_cumulative_product", "greedy_path_order", "theta_along_the_path_appendix_a"]
    try:
        report = grade(ASSIGNMENTS[5], solution_file(tmp_path, source), timeout=4, only=only)
        assert [r.passed for r in report.results] == [True, False, False], [r.line() for r in report.results]
        assert report.results[1].detail == "timed out after 4s"
        assert "exit status 3" in report.results[2].detail
        end = time.monotonic() + 3
        while marked(marker) and time.monotonic() < end:  # a SIGKILL takes a moment
            time.sleep(0.05)
        assert not marked(marker), f"{len(marked(marker))} sleeper(s) outlived grading"
    finally:
        for pid in marked(marker):  # the test's own processes, should the grader have left them
            os.kill(pid, signal.SIGKILL)


# ---- the reference solution reused ---------------------------------------------------------------------
def disguised_copy(source: str) -> str:
    """The same code: docstrings and comments gone, other comments and blank lines added,
    indented by 2 spaces instead of 4, spaces around some operators dropped."""
    source = re.sub(r'^"""(.|\n)*?"""\n', "", source)  # the module docstring
    lines = ["# my solution to assignment 5", ""]
    for line in source.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        line = " " * (indent // 2) + line.lstrip(" ").replace(" = ", "=")
        lines += [line + "  # mine" if line.startswith("def ") else line, ""]
    return "\n".join(lines)


def test_a_copy_of_the_reference_solution_fails_every_check(tmp_path):
    copy = solution_file(tmp_path, disguised_copy(REFERENCE_A5.read_text()))
    assert copy.read_text() != REFERENCE_A5.read_text()
    only = ["survival_is_the_cumulative_product", "greedy_path_order"]
    report = grade(ASSIGNMENTS[5], copy, only=only)
    assert report.score == 0 and [r.name for r in report.results] == only
    for result in report.results:
        assert result.detail.startswith("uses the instructor's reference solution (a copy of "), result.line()
        assert "a5_scheduling.py" in result.detail, result.line()


def test_code_that_only_resembles_the_reference_is_not_flagged(tmp_path):
    """One name changed: not a copy (the grader then grades the answers, which are right)."""
    source = REFERENCE_A5.read_text()
    for old, new in [
        ("rates = []", "found = []"),
        ("rates.append", "found.append"),
        ("return rates", "return found"),
    ]:
        source = source.replace(old, new)
    only = ["theta_along_the_path_appendix_a", "greedy_path_order"]
    report = grade(ASSIGNMENTS[5], solution_file(tmp_path, source), only=only)
    assert report.score == report.total, [r.line() for r in report.results if not r.passed]


READS = {
    "at-import": """
        from pathlib import Path

        import dspark

        _folder = Path(dspark.__file__).parent / "course" / ("refer" + "ence")
        exec(compile((_folder / "a5_scheduling.py").read_text(), "answer", "exec"))
    """,
    "in-a-function": """
        from pathlib import Path

        import dspark


        def prefix_survival(confidences):
            answer = {}
            folder = Path(dspark.__file__).parent / "course" / ("refer" + "ence")
            exec((folder / "a5_scheduling.py").read_text(), answer)
            return answer["prefix_survival"](confidences)


        def greedy_path(survivals):  # the student's own
            R, gamma = survivals.shape
            order = sorted(((r, j) for r in range(R) for j in range(gamma)),
                           key=lambda rj: (-float(survivals[rj]), rj[1], rj[0]))
            return torch.tensor(order, dtype=torch.long)
    """,
}


@pytest.mark.parametrize("how", sorted(READS))
def test_reading_the_reference_solution_at_run_time_fails_the_checks_it_helped(tmp_path, how):
    path = solution_file(tmp_path, "import torch\n" + textwrap.dedent(READS[how]))
    only = ["survival_is_the_cumulative_product", "greedy_path_order"]
    report = grade(ASSIGNMENTS[5], path, only=only)
    helped, other = report.results
    for result in [helped, other] if how == "at-import" else [helped]:
        assert not result.passed, result.line()
        assert result.detail.startswith("uses the instructor's reference solution: read "), result.line()
        assert "a5_scheduling.py" in result.detail, result.line()
    if how == "in-a-function":
        assert other.passed, other.line()  # its own code, in a process that never read the reference


def test_grading_the_reference_itself_is_not_flagged(capsys):
    status = run_main(grade_command.main, ["5", "--reference"])
    out, err = capsys.readouterr()
    assert status == 0 and not err and "uses the instructor's" not in out
    assert out.strip().splitlines()[-1] == f"score: {ASSIGNMENTS[5].points}/{ASSIGNMENTS[5].points}"


# ---- a solution path that is not a Python file ------------------------------------------------------
@pytest.mark.parametrize(
    "name, message",
    [
        ("notes.txt", "notes.txt is not a Python file (.py)"),
        ("solution", "solution is not a Python file (.py)"),
        ("folder.py", "folder.py is a folder, not a Python file (.py)"),
    ],
)
def test_a_solution_that_is_not_a_python_file_is_one_clean_line(tmp_path, monkeypatch, capsys, name, message):
    path = tmp_path / name
    if name.startswith("folder"):
        path.mkdir()
    else:
        path.write_text("def verify(*args):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    status = run_main(grade_command.main, ["1", name])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    assert err.count("\n") == 1 and "NoneType" not in err and "Error" not in err, err
    assert err == f"error: {message}\n", err
    if path.is_file():
        with pytest.raises(SolutionError, match=re.escape(message)):
            grade(ASSIGNMENTS[1], path)
