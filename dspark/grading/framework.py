"""The grading framework: checks, the runner that keeps the verdict out of the student's reach, the report.

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
  * FAIL "uses the instructor's reference solution (...)" when the file imports
    dspark.grading.reference: found in its source before anything runs (then every check
    fails), or seen being imported while the check ran (that check fails).

The check's process (second half of this file). `CheckProcess(path, timeout)` forks a
supervisor, which starts a new session (its own process group) and forks the check's process;
that one moves into a fresh scratch folder, sends its stdout and stderr to a file the grader
reads (`CheckResult.output`, shown under the check's line by `python -m dspark.grade`), closes
every other descriptor it inherited, imports the student's file and serves `Call`s: a pickle
on one pipe in, a reply on another out. A reply is plain data only -- numbers, strings,
lists, tuples, dicts, and tensors as (dtype, shape, bytes) -- read by an unpickler that loads
no class at all; anything else arrives as `NotPlainData`, so nothing the student's code sends
can run code here. Test doubles that must watch the student's code
(`Probe`s) record there and are judged here. The supervisor only waits for the check's process
and exits as it did, so a student that kills its parent kills the supervisor, not the grader.
When the check ends, or its time is up, `close` kills the check's process (by pidfd, wherever
it went) and the whole process group (everything it started), and removes the scratch folder.
Each reply also names the reference modules the student's code imported (an import hook, and
sys.modules). Grading needs os.fork (Linux, macOS; on Windows, WSL).

What this cannot stop, running as the grader's own user (a container can, see
walkthrough/assignments/INSTRUCTORS.md): code that finds the grader's process (through /proc)
and signals it or writes to its terminal, that reads or deletes files by absolute path, or that
forks a process which leaves the session with setsid(). What this file does not do: define
checks (dspark/grading/a*.py) or parse a command line (dspark/grade.py).
"""

from __future__ import annotations

import ast
import faulthandler
import importlib.abc
import importlib.util
import io
import math
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import torch

try:
    import resource  # POSIX only, as is os.fork: on Windows the module imports, grading refuses
except ImportError:  # pragma: no cover
    resource = None

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS_DIR = REPO_ROOT / "walkthrough" / "assignments"
DEFAULT_TIMEOUT = 60.0  # seconds per check: generous, an honest check takes well under 5 s
MAX_TIMEOUT = 3600.0  # the most --timeout may be
STUDENT_MODULE = "student_solution"
REFERENCE_PACKAGE = "dspark.grading.reference"
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
MAX_REPLY_BYTES = 256 << 20  # one reply: far more than any check's answers
MAX_OUTPUT_BYTES = 64 << 20  # the student's stdout + stderr file (RLIMIT_FSIZE in the check's process)
MAX_DEPTH = 32  # nesting of a reply's lists, tuples and dicts
NOT_PLAIN = "__dspark_not_plain_data__"  # marks a value that was not plain data, in a reply
_HEADER = struct.Struct(">Q")  # every message: its length, then its bytes
_POLL = 0.05  # seconds between looks at the supervisor while waiting on a pipe


class CheckFailed(Exception):
    """The student's answer is wrong; the message says how, in one line."""


class SolutionError(Exception):
    """The solution file cannot be graded at all (it does not import); the message says why."""


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


# ---- messages ---------------------------------------------------------------------------------------
def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, invisible characters escaped, at most `limit` characters."""
    text = printable(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value) -> str:
    """A short printable form of a tensor or list (floats rounded, long lists cut)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.double().round(decimals=4).tolist() if value.is_floating_point() else value.tolist()
    text = str(value)
    return text if len(text) <= 120 else text[:119] + "…"


def kind(value: Any) -> str:
    """The name of `value`'s type, as the student's code returned it ("ndarray", "float", ...)."""
    return value.type_name if isinstance(value, NotPlainData) else type(value).__name__


def expect_tensor(value, name: str, shape: Iterable[int] | None = None, dtype: torch.dtype | None = None):
    """`value` must be a tensor (of this shape and dtype) and, if floating, hold no NaN or inf; returns it."""
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{name} should be a torch.Tensor, got {kind(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CheckFailed(f"{name} has dtype {value.dtype}, expected {dtype}")
    if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
        raise CheckFailed(f"{name} contains NaN or inf: {show(value)}")
    return value


def expect_number(got, expected: float, what: str, hint: str = "", atol: float = 1e-6) -> None:
    """`got` must be a finite number within `atol` of `expected` (NaN and inf never are)."""
    value = number(got, what)
    if not abs(value - expected) <= atol:
        raise CheckFailed(f"{what} = {value:.6g}, expected {expected:.6g}" + (f"; {hint}" if hint else ""))


def number(value, what: str) -> float:
    """`value` (a Python number or a one-element tensor) as a finite float, else CheckFailed."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise CheckFailed(f"{what} should be a number, got {kind(value)}")
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise CheckFailed(f"{what} should be a number, got a tensor of shape {tuple(value.shape)}")
    try:
        result = float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise CheckFailed(f"{what} should be a number, got {kind(value)}") from None
    if not math.isfinite(result):
        raise CheckFailed(f"{what} = {result}, which is never right: the answer is a finite number")
    return result


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
    if process.reference and not inside(path, REFERENCE_DIR):
        passed, detail = False, reference_used(process.reference)
    return CheckResult(check.name, check.points, passed, detail, process.output)


def reference_used(modules: list[str]) -> str:
    """The failure of a check during which the student's code imported these reference modules."""
    deepest = [n for n in modules if not any(m.startswith(n + ".") for m in modules)]
    return one_line(
        f"uses the instructor's reference solution: imported {', '.join(deepest)} (the handouts forbid it)"
    )


def check_timeout(timeout: float) -> None:
    """ValueError unless `timeout` is a number of seconds in (0, MAX_TIMEOUT]."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise ValueError(
            f"the timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds, got {timeout!r}"
        )


def check_imports(path: Path, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Raise SolutionError unless the file exists and imports within `timeout` seconds."""
    path = Path(path).resolve()
    if not path.is_file():
        raise SolutionError(f"no solution file at {path}")
    check_timeout(timeout)
    _need_fork()
    with CheckProcess(path, timeout) as process:
        ok, detail = _verdict(lambda: Solution(process).imported(), timeout)
    if not ok:
        raise SolutionError(f"cannot import {path.name}: {detail.removeprefix('crashed: ')}")


def _need_fork() -> None:
    if not hasattr(os, "fork"):
        raise SolutionError("grading needs os.fork: Linux or macOS (on Windows, use WSL)")


def reference_imports(path: Path) -> list[str]:
    """Where the file's source imports the reference package, or names it in a call
    (importlib.import_module("..."), a path to it): "line N: dspark.grading.reference...".
    A file that does not parse has none (check_imports reports it)."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call):
            arguments = [*node.args, *(k.value for k in node.keywords)]
            names = [a.value for a in arguments if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        else:
            continue
        hit = next((n for n in names if _names_reference(n)), None)
        if hit is not None:
            found.append(f"line {node.lineno}: {one_line(hit, 100)}")
    return found


def _names_reference(text: str) -> bool:
    dotted = text.replace("/", ".").replace("\\", ".")
    return "grading.reference" in dotted  # REFERENCE_PACKAGE, or the same from dspark/ on


def reference_flag(path: Path) -> str:
    """The failure every check gets when the source imports the reference solution, else ""."""
    if inside(path, REFERENCE_DIR):
        return ""  # grading the reference itself (--reference)
    found = reference_imports(path)
    if not found:
        return ""
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return f"uses the instructor's reference solution ({found[0]}{more}); the handouts forbid it"


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


# ==== the check's process, and the grader's handle on it ================================================
class TimedOut(Exception):
    """The check's deadline passed."""


class ProcessEnded(Exception):
    """The check's process died or closed its pipe; the message says how ("exit status 3")."""


class BadReply(Exception):
    """The check's process sent something that is not a reply; the message says what."""


@dataclass(frozen=True)
class NotPlainData:
    """Stands for a value the student's code returned that is not plain data (its type's name)."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


class Probe:
    """A test double handed to the student's code that records what it saw. After a call, the
    check's process sends `grading_log()` (plain data) and the grader feeds it to the grader's
    own copy with `absorb_grading_log`, which judges it there."""

    def grading_log(self) -> Any:
        raise NotImplementedError

    def absorb_grading_log(self, log: Any) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Call:
    """One request: call the student's function `name(*args, **kwargs)`; send back its value, the
    arguments after the call if `return_arguments`, and each probe's log."""

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    probes: tuple[Probe, ...] = ()
    return_arguments: bool = False


# ---- plain data ---------------------------------------------------------------------------------------
TENSOR = "__dspark_tensor__"  # marks a tensor in a reply: (dtype name, shape, bytes)
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16)
    + (torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
}


def to_plain(value: Any, depth: int = 0) -> Any:
    """`value` as plain data (in the check's process): tensors as (dtype, shape, bytes), containers
    rebuilt, numpy scalars as Python numbers, anything else as a marker naming its type."""
    if depth > MAX_DEPTH:
        return {NOT_PLAIN: "too deeply nested value"}
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return value
    if isinstance(value, torch.Tensor):
        return _tensor_to_plain(value)
    for kind in (bool, int, float, str):  # subclasses (IntEnum, ...) as the base type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (list, tuple)):
        items = [to_plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_plain_key(k): to_plain(v, depth + 1) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return to_plain(value.item(), depth + 1)
    return {NOT_PLAIN: type(value).__name__}


def _tensor_to_plain(value: torch.Tensor) -> dict:
    tensor = value.detach().cpu()
    tensor = tensor.to_dense() if tensor.layout != torch.strided else tensor
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        return {NOT_PLAIN: f"tensor of dtype {name}"}
    tensor = tensor.resolve_conj().resolve_neg().as_subclass(torch.Tensor).contiguous().clone()
    return {TENSOR: (name, tuple(tensor.shape), bytes(tensor.untyped_storage()))}


def _plain_key(key: Any) -> Any:
    return key if key is None or type(key) in (bool, int, float, str) else f"<{type(key).__name__}>"


def from_plain(value: Any, depth: int = 0) -> Any:
    """A decoded reply with its markers turned back into tensors and `NotPlainData` (in the grader)."""
    if depth > MAX_DEPTH:
        raise BadReply("the reply is nested too deeply")
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(NOT_PLAIN), str):
            return NotPlainData(value[NOT_PLAIN])
        if len(value) == 1 and TENSOR in value:
            return _tensor_from_plain(value[TENSOR])
        return {k: from_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(from_plain(v, depth + 1) for v in value)
    return value


def _tensor_from_plain(spec: Any) -> torch.Tensor:
    """The tensor of a (dtype name, shape, bytes) triple, checked to fit together."""
    if not (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], bytes)):
        raise BadReply("the check's process sent back a damaged tensor")
    name, shape, data = spec
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None or not isinstance(shape, tuple) or len(shape) > MAX_DEPTH:
        raise BadReply("the check's process sent back a damaged tensor")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise BadReply("the check's process sent back a damaged tensor")
    if math.prod(shape) * torch.empty((), dtype=dtype).element_size() != len(data):
        raise BadReply("the check's process sent back a damaged tensor")
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _PlainUnpickler(pickle.Unpickler):
    """Loads lists, tuples, dicts, strings, bytes and numbers: no class and no function at all
    (complex numbers aside), so unpickling a reply cannot run anything."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("a reply has no persistent ids")


def encode_reply(reply: dict) -> bytes:
    """A reply (plain data only: `to_plain` made it so) as bytes."""
    return pickle.dumps(reply, protocol=5)


def decode_reply(data: bytes) -> dict:
    """The reply in `data`, read as plain data only (BadReply otherwise)."""
    try:
        reply = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - whatever the bytes are, they are not a reply
        what = type(exc).__name__
        raise BadReply(f"the check's process sent back garbage ({what})") from None
    reply = from_plain(reply)
    if not isinstance(reply, dict) or reply.get("kind") not in ("returned", "raised", "missing", "hello"):
        raise BadReply("the check's process sent back something that is not a reply")
    return reply


# ---- the check's process ------------------------------------------------------------------------------
class ReferenceWatch(importlib.abc.MetaPathFinder):
    """An import hook that notes every import of the reference package (and lets it happen)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._before: set[str] = set()  # the modules loaded when the watch began

    def find_spec(self, fullname: str, path=None, target=None):
        if is_reference(fullname):
            self.seen.add(fullname)
        return None

    def install(self) -> None:
        """Forget the reference modules the grader had loaded, so that any import of them is seen."""
        for name in [n for n in sys.modules if n.startswith(REFERENCE_PACKAGE)]:
            if is_reference(name):
                del sys.modules[name]
        grading = sys.modules.get("dspark.grading")
        if grading is not None and hasattr(grading, "reference"):
            delattr(grading, "reference")
        self._before = set(sys.modules)
        sys.meta_path.insert(0, self)

    def report(self) -> list[str]:
        """The reference modules imported so far: by name, or loaded from the reference folder
        under another name (searched among the modules loaded since `install`)."""
        for name in sys.modules.keys() - self._before:
            module = sys.modules.get(name)
            if is_reference(name) or (name != STUDENT_MODULE and _from_reference_dir(module)):
                self.seen.add(name)
        return sorted(self.seen)


def _from_reference_dir(module: ModuleType) -> bool:
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str) or "reference" not in origin:  # the cheap test first
        return False
    return inside(Path(origin), REFERENCE_DIR)


def is_reference(module: str) -> bool:
    return module == REFERENCE_PACKAGE or module.startswith(REFERENCE_PACKAGE + ".")


def inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder)
    except (OSError, RuntimeError):
        return False


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


def _close_fds_except(keep: Iterable[int]) -> None:
    limit = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536
    start = 0
    for fd in [*sorted(set(keep)), max(limit, max(keep, default=0) + 1)]:
        if start < fd:  # (on CPython 3.11 os.closerange(0, 0) closes every descriptor)
            os.closerange(start, fd)
        start = fd + 1


def _text_stream(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True, errors="backslashreplace")


@dataclass(frozen=True)
class Job:
    """What the check's process needs: the file, its folders and its three descriptors."""

    path: Path
    scratch: Path
    requests: int  # read end of the grader's requests
    replies: int  # write end of the replies
    output: int  # the file that receives stdout and stderr


def _enter_sandbox(job: Job) -> None:
    """Scratch folder as the working directory, stdout/stderr into the output file, nothing else open."""
    os.chdir(job.scratch)
    os.environ["TMPDIR"] = str(job.scratch)
    tempfile.tempdir = None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(job.output, 1)
    os.dup2(job.output, 2)
    _close_fds_except((0, 1, 2, job.requests, job.replies))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    faulthandler.enable(sys.stderr)  # a segfault's traceback goes to the student's output
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the size limit a write fails instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_OUTPUT_BYTES, MAX_OUTPUT_BYTES))
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.default_generator.manual_seed(0)  # (torch.manual_seed would also queue CUDA seeding: slow)


def _send(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> bytes | None:
    """The next message on `fd` (blocking), or None at the end."""
    header = _read_exactly(fd, _HEADER.size)
    return None if header is None else _read_exactly(fd, _HEADER.unpack(header)[0])


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _raised(exc: BaseException, path: Path) -> dict:
    """The reply for an exception of the student's code: its type, message and place in the file."""
    try:
        message = str(exc)[:1000]
    except Exception:  # noqa: BLE001 - a message that cannot be printed is no message
        message = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    error = {
        "type": type(exc).__name__,
        "message": message,
        "function": frames[-1].name if frames else "",
        "where": f"{path.name}:{frames[-1].lineno} in {frames[-1].name}" if frames else "",
        "not_implemented": isinstance(exc, NotImplementedError),
    }
    return {"kind": "raised", "error": error}


def _serve(module: ModuleType, call: Call, path: Path) -> dict:
    """Run one call of the student's function; the reply (plain data)."""
    fn = getattr(module, call.name, None)
    if not callable(fn):
        return {"kind": "missing", "name": call.name}
    try:
        value = fn(*call.args, **call.kwargs)
    except BaseException as exc:  # noqa: BLE001 - whatever the student's code raises is reported
        return _raised(exc, path)
    reply = {
        "kind": "returned",
        "value": to_plain(value),
        "logs": [to_plain(p.grading_log()) for p in call.probes],
    }
    if call.return_arguments:
        reply["arguments"] = to_plain(list(call.args))
    return reply


def _reply(job: Job, reply: dict, watch: ReferenceWatch) -> None:
    reply["reference"] = watch.report()
    try:
        data = encode_reply(reply)
    except Exception as exc:  # noqa: BLE001 - e.g. a recursion too deep for pickle
        data = encode_reply(_raised(RuntimeError(f"the value cannot be sent back: {exc}"), job.path))
    _send(job.replies, data)


def _check_process(job: Job) -> NoReturn:
    """The check's process: sandbox, say hello, import the student's file, then serve calls until EOF."""
    _enter_sandbox(job)
    _send(job.replies, encode_reply({"kind": "hello", "pid": os.getpid()}))
    watch = ReferenceWatch()
    watch.install()
    try:
        module = import_solution(job.path)
    except BaseException as exc:  # noqa: BLE001 - a file that does not import is reported
        _reply(job, _raised(exc, job.path), watch)
        _exit(0)
    _reply(job, {"kind": "returned", "value": None, "logs": []}, watch)
    while (request := _receive(job.requests)) is not None:
        try:
            reply = _serve(module, pickle.loads(request), job.path)
        except BaseException as exc:  # noqa: BLE001 - e.g. a value to_plain cannot read
            reply = _raised(exc, job.path)
        _reply(job, reply, watch)
    _exit(0)


def _exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - nothing more can be said
            pass
    os._exit(code)


def _supervisor(job: Job) -> NoReturn:
    """A new session; the check's process in it; then wait for that process and exit as it did."""
    try:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        child = os.fork()
        if child == 0:
            try:
                _check_process(job)
            finally:
                os._exit(70)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _close_fds_except((0, 1, 2))  # no pipe end: the replies' EOF means the check's process is gone
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            _die_by(os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    finally:
        os._exit(70)


def _die_by(number: int) -> NoReturn:
    """End this process by signal `number`, as the check's process did."""
    try:
        signal.signal(number, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled, nor need to be
        pass
    os.kill(os.getpid(), number)
    os._exit(128 + number)


# ---- the grader's side -----------------------------------------------------------------------------------
class CheckProcess:
    """One check's process as the grader sees it: `call`, then `close` (also on leaving a `with`)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.scratch = Path(tempfile.mkdtemp(prefix="dspark-grade-"))
        self.output_file = tempfile.TemporaryFile()
        self.reference: list[str] = []  # reference modules the student's code imported
        self.output = ""  # what it printed, once closed
        self.healthy = True  # False once it timed out, died or sent something unreadable
        self.imported: dict | None = None
        self._child_pidfd: int | None = None
        request_read, self._requests = os.pipe()
        self._replies, reply_write = os.pipe()
        job = Job(path, self.scratch, request_read, reply_write, self.output_file.fileno())
        sys.stdout.flush()  # the forks inherit unflushed buffers: flush so nothing prints twice
        sys.stderr.flush()
        try:
            self.supervisor = os.fork()
        except OSError:
            for fd in (request_read, self._requests, self._replies, reply_write):
                os.close(fd)
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        if self.supervisor == 0:
            _supervisor(job)
        os.close(request_read)
        os.close(reply_write)
        os.set_blocking(self._requests, False)
        os.set_blocking(self._replies, False)
        self._supervisor_fd = _pidfd(self.supervisor)

    def __enter__(self) -> CheckProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- talking
    def start(self) -> dict:
        """Wait for the student's file to be imported; its reply (kind "returned" or "raised")."""
        if self.imported is None:
            hello = self._receive()
            if hello.get("kind") != "hello" or not isinstance(hello.get("pid"), int):
                raise self._bad(BadReply("the check's process did not start properly"))
            self._watch_child(hello["pid"])
            imported = self._receive()
            if not _fits(imported, Call("")) or imported["kind"] == "missing":
                raise self._bad(
                    BadReply("the check's process sent back a reply that does not fit the import")
                )
            self.imported = imported
        return self.imported

    def call(self, call: Call) -> dict:
        """Send one call and return its reply (validated: BadReply if it does not fit the call)."""
        self.start()
        data = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
        self._write(_HEADER.pack(len(data)) + data)
        reply = self._receive()
        if not _fits(reply, call):
            raise self._bad(BadReply("the check's process sent back a reply that does not fit the call"))
        return reply

    def _receive(self) -> dict:
        try:
            header = self._read(_HEADER.size)
            (size,) = _HEADER.unpack(header)
            if size > MAX_REPLY_BYTES:
                raise BadReply(f"the check's process sent back garbage (a message of {size} bytes announced)")
            reply = decode_reply(self._read(size))
        except (TimedOut, ProcessEnded, BadReply) as exc:
            raise self._bad(exc) from None
        names = reply.get("reference", [])
        if isinstance(names, list):
            self.reference = sorted({*self.reference, *(str(n) for n in names)})
        return reply

    def _bad(self, exc: Exception) -> Exception:
        self.healthy = False
        return exc

    def _read(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            self._wait(self._replies, for_writing=False)
            try:
                chunk = os.read(self._replies, min(n - got, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise ProcessEnded(self._how_it_ended())
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                self._wait(self._requests, for_writing=True)
                try:
                    view = view[os.write(self._requests, view) :]
                except BlockingIOError:
                    continue
        except BrokenPipeError:
            raise self._bad(ProcessEnded(self._how_it_ended())) from None
        except (TimedOut, ProcessEnded) as exc:
            raise self._bad(exc) from None

    def _wait(self, fd: int, for_writing: bool) -> None:
        """Until `fd` is ready; TimedOut at the deadline, ProcessEnded once the supervisor has exited
        and the pipe has nothing more."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimedOut()
            if _ready(fd, for_writing, min(left, _POLL)):
                return
            if self._exit_status() is not None and not _ready(fd, for_writing, 0):
                raise ProcessEnded(self._how_it_ended())

    # -- the processes
    def _watch_child(self, pid: int) -> None:
        """A pidfd for the check's process, so it can be killed even after it left the group."""
        self._child_pidfd = _pidfd(pid)

    def _exit_status(self) -> str | None:
        """How the supervisor (which exits as the check's process did) ended, without reaping it; None
        while it runs (or where waitid is missing)."""
        if not hasattr(os, "waitid"):
            return None
        try:
            info = os.waitid(os.P_PID, self.supervisor, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "reaped"
        if info is None or info.si_pid == 0:
            return None
        if info.si_code == os.CLD_EXITED:
            return f"exit status {info.si_status}"
        try:
            return f"killed by signal {signal.Signals(info.si_status).name}"
        except ValueError:
            return f"killed by signal {info.si_status}"

    def _await_supervisor(self, seconds: float) -> str | None:
        """Wait up to `seconds` for the supervisor to exit (not reaping it); how it ended, or None."""
        end = time.monotonic() + seconds
        while (status := self._exit_status()) is None and (left := end - time.monotonic()) > 0:
            if self._supervisor_fd is not None:
                _ready(self._supervisor_fd, for_writing=False, timeout=left)  # readable once it exited
            else:
                time.sleep(min(left, 0.005))
        return status

    def _how_it_ended(self) -> str:
        status = self._await_supervisor(1.0)
        how = f" ({status})" if status else ""
        return f"the check's process died without a reply{how}"

    def close(self) -> None:
        """Kill the check's process group and whatever is left of it; collect the output; clean up."""
        if self._requests < 0:
            return
        os.close(self._requests)  # the check's process reads EOF and exits
        self._requests = -1
        if self.healthy and self._child_pidfd is None:  # let it leave, and the supervisor reap it
            self._await_supervisor(0.5)
        self._kill()
        os.close(self._replies)
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.output = read_output(self.output_file)
        self.output_file.close()

    def _kill(self) -> None:
        """SIGKILL the check's process (by pidfd: found even outside its group) and let the supervisor
        reap it (no zombie left behind); then SIGKILL the whole group, and reap the supervisor."""
        if self._child_pidfd is not None:
            try:
                signal.pidfd_send_signal(self._child_pidfd, signal.SIGKILL)
            except OSError:
                pass
            os.close(self._child_pidfd)
            self._await_supervisor(0.5)
        try:  # the supervisor is not reaped yet, so its group id cannot belong to anyone else
            os.killpg(self.supervisor, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        os.waitpid(self.supervisor, 0)
        if self._supervisor_fd is not None:
            os.close(self._supervisor_fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor for process `pid` (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    except OSError:
        return None


def _ready(fd: int, for_writing: bool, timeout: float) -> bool:
    """Is `fd` readable (writable), waiting up to `timeout` seconds? (poll: no limit on fd numbers)"""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if for_writing else select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


def _fits(reply: dict, call: Call) -> bool:
    """Does `reply` have the fields its kind needs, for this call?"""
    kind = reply["kind"]
    if kind == "returned":
        logs, arguments = reply.get("logs"), reply.get("arguments")
        if not (isinstance(logs, list) and len(logs) == len(call.probes)):
            return False
        return not call.return_arguments or (isinstance(arguments, list) and len(arguments) == len(call.args))
    if kind == "raised":
        error = reply.get("error")
        return isinstance(error, dict) and all(
            isinstance(error.get(k), str) for k in ("type", "message", "function", "where")
        )
    return kind == "missing"


def read_output(file, max_lines: int = 20, max_chars: int = 200) -> str:
    """The last lines the student's code printed, each cut and made printable."""
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - 64 * 1024))
    lines = [printable(line)[:max_chars] for line in file.read().decode("utf-8", "replace").splitlines()]
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) > max_lines or size > 64 * 1024:
        shown = lines[-max_lines:]
        return "\n".join(["… (earlier output not shown)", *shown])
    return "\n".join(lines)


def printable(text: str) -> str:
    """`text` with control and other invisible characters written as escapes (\\x1b, \\r, ...)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
