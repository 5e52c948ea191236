"""The grading framework: checks, a crash- and hang-proof runner, and the per-check report.

A `Check` is a name, a number of points and a function that receives the student's
module and raises `CheckFailed("what is wrong")` when an answer is wrong (the helpers
`expect_tensor`, `expect_equal`, `expect_close` write those messages). An `Assignment`
is a numbered list of checks plus where its starter and its reference solution live.

`grade(assignment, path)` runs none of the student's code in this process. It first
imports the file in a forked child (a file that fails to import, or hangs while
importing, raises `SolutionError`), then runs every check in its own forked child
process with torch limited to one thread, gradients off and a fixed seed. The child
reports one verdict through a pipe; the parent waits at most `timeout` seconds and
kills it otherwise. So a check ends as

  * PASS;
  * FAIL with the check's one-line reason;
  * FAIL "not implemented" when the student's code raised NotImplementedError;
  * FAIL "crashed: ExcType: message (file.py:line in function)" for any other
    exception, or when the child died without a verdict (os._exit, a segfault);
  * FAIL "timed out after Ns".

Without the "fork" start method (Windows) the checks run in this process, one after
the other, without time limits.

What this file does not do: define checks (dspark/grading/a*.py) or parse a command
line (dspark/grade.py).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS_DIR = REPO_ROOT / "walkthrough" / "assignments"
DEFAULT_TIMEOUT = 60.0  # seconds per check: generous, an honest check takes well under 5 s
STUDENT_MODULE = "student_solution"


class CheckFailed(Exception):
    """The student's answer is wrong; the message says how, in one line."""


class SolutionError(Exception):
    """The solution file cannot be graded at all (it does not import); the message says why."""


@dataclass(frozen=True)
class Check:
    name: str
    points: int
    run: Callable[[ModuleType], None]  # raises CheckFailed on a wrong answer


class CheckList:
    """Collects an assignment's checks in the order they are written: `@checks.add(points)`."""

    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, points: int) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], None]]:
        def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
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


@dataclass
class CheckResult:
    name: str
    points: int
    passed: bool
    detail: str = ""  # why it failed: a reason, "not implemented", "crashed: ...", "timed out after Ns"

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


# ---- messages ---------------------------------------------------------------------------------------
def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value) -> str:
    """A short printable form of a tensor or list (floats rounded, long lists cut)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.double().round(decimals=4).tolist() if value.is_floating_point() else value.tolist()
    text = str(value)
    return text if len(text) <= 120 else text[:119] + "…"


def expect_tensor(value, name: str, shape: Iterable[int] | None = None, dtype: torch.dtype | None = None):
    """`value` must be a tensor (of this shape and dtype); returns it."""
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{name} should be a torch.Tensor, got {type(value).__name__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CheckFailed(f"{name} has dtype {value.dtype}, expected {dtype}")
    return value


def expect_equal(actual, expected, what: str, hint: str = "") -> None:
    """Exact equality of tensors/lists/numbers; the message shows both and the hint."""
    same = (
        torch.equal(actual, expected)
        if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
        else actual == expected
    )
    if not same:
        raise CheckFailed(
            f"{what}: got {show(actual)}, expected {show(expected)}" + (f"; {hint}" if hint else "")
        )


def expect_close(actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-5, hint: str = ""):
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if not torch.isfinite(actual).all():
        raise CheckFailed(f"{what} contains NaN or inf: {show(actual)}" + (f"; {hint}" if hint else ""))
    gap = (actual.double() - expected.double()).abs()
    if gap.numel() and float(gap.max()) > atol:
        i = int(gap.flatten().argmax())
        raise CheckFailed(
            f"{what} differs from the expected value by {float(gap.max()):.3g} at flat index {i} "
            f"(got {float(actual.flatten()[i]):.5g}, expected {float(expected.flatten()[i]):.5g})"
            + (f"; {hint}" if hint else "")
        )


def function(solution: ModuleType, name: str) -> Callable:
    """The student's function `name`, or a clear failure if the file does not define it."""
    fn = getattr(solution, name, None)
    if not callable(fn):
        raise CheckFailed(f"the solution file defines no function `{name}` (keep the starter's names)")
    return fn


# ---- running ------------------------------------------------------------------------------------------
def import_solution(path: Path) -> ModuleType:
    """Execute the student's file as the module `student_solution` (its folder on sys.path)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(STUDENT_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[STUDENT_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _where(exc: BaseException, path: Path) -> str:
    """' (file.py:41 in verify)' for the innermost frame of the student's file, else ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f" ({path.name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""


def _verdict(run: Callable[[], None], path: Path) -> tuple[bool, str]:
    try:
        run()
    except CheckFailed as exc:
        return False, one_line(str(exc))
    except NotImplementedError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
        return False, "not implemented" + (f" ({frames[-1].name})" if frames else "")
    except BaseException as exc:  # noqa: BLE001 - anything the student's code raises is reported, not raised
        message = f": {exc}" if str(exc) else ""
        return False, one_line(f"crashed: {type(exc).__name__}{message}") + _where(exc, path)
    return True, ""


def _in_child(run: Callable[[], None], path: Path, conn) -> None:
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    conn.send(_verdict(run, path))
    conn.close()


def run_isolated(run: Callable[[], None], path: Path, timeout: float) -> tuple[bool, str]:
    """`_verdict(run)` in a forked child, killed after `timeout` seconds."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return _verdict(run, path)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    sys.stdout.flush()  # the child inherits unflushed buffers: flush so nothing prints twice
    sys.stderr.flush()
    child = context.Process(target=_in_child, args=(run, path, send), daemon=True)
    child.start()
    send.close()  # the child holds the only writing end: its death reads as EOF here
    verdict = None
    try:
        if receive.poll(timeout):
            try:
                verdict = receive.recv()
            except EOFError:
                child.join(5)
                verdict = (
                    False,
                    f"crashed: the check's process died without a verdict (exit status {child.exitcode})",
                )
    finally:
        if verdict is not None:
            child.join(5)  # it has reported and is exiting
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    return verdict if verdict is not None else (False, f"timed out after {timeout:g}s")


def check_imports(path: Path, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Raise SolutionError unless the file exists and imports within `timeout` seconds."""
    path = path.resolve()
    if not path.is_file():
        raise SolutionError(f"no solution file at {path}")
    ok, detail = run_isolated(lambda: import_solution(path), path, timeout)
    if not ok:
        detail = detail.removeprefix("crashed: ")
        raise SolutionError(f"cannot import {path.name}: {detail}")


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
    if check_import:
        check_imports(path, timeout)
    wanted = set(only) if only is not None else None
    report = Report(assignment)
    for check in assignment.checks:
        if wanted is not None and check.name not in wanted:
            continue

        def run(check: Check = check) -> None:
            check.run(import_solution(path))

        passed, detail = run_isolated(run, path, timeout)
        result = CheckResult(check.name, check.points, passed, detail)
        report.results.append(result)
        if on_result is not None:
            on_result(result)
    return report
