"""The check's process: where the student's code runs, and nothing of the grader's verdict does.

`CheckProcess` (dspark/course/check_process.py) forks `run_supervisor`, which starts a new
session (its own process group) and forks the check's process (`_check_process`): that one moves
into a fresh scratch folder, sends its stdout and stderr to a file the grader reads, closes every
other descriptor it inherited, installs the `ReferenceWatch`, imports the student's file as
`student_solution` and serves `Call`s: a pickle on one pipe in, a reply (plain data,
dspark/course/plain_data.py) on another out, until the grader closes the requests' pipe. Each
reply says what the call returned or raised (type, message, where in the student's file), the
probes' logs, and the reference modules imported and reference files opened so far. The
supervisor waits for the check's process, ends every process it left (below), and exits as it
did, so a student that kills its parent kills the supervisor, not the grader. Needs os.fork and
the POSIX `resource` module (Linux, macOS).

Ending every process the check's code started, found with psutil (on Linux it reads /proc):
`become_subreaper` makes the supervisor the Linux "child subreaper" of everything below it, so a
process whose parent dies is re-parented to the supervisor, not to init, and no descendant leaves
the tree, whatever session or process group it moved to (`setsid`, `start_new_session=True`, a
double fork). `kill_tree` ends such a tree: it stops (SIGSTOP) every live descendant until a scan
finds none still running -- a stopped process cannot fork, and no parent dies meanwhile, so none
is orphaned out of reach -- then kills (SIGKILL) them all, scan after scan, until none is left
(or SWEEP_SECONDS are up). The supervisor runs it once the check's process has ended, and the
grader again when it closes the check (dspark/course/check_process.py). Off Linux (no prctl)
there is no subreaper: a process whose parent died went to init, out of reach, and the process
group is killed as well. No tree walk finds a process re-parented to init because the subreaper
was already dead (the student's code killed the supervisor first), nor one another service
started (cron, at, systemd-run).

What this file does not do: judge anything (the grader does, dspark/course/framework.py),
enforce the time limit (dspark/course/check_process.py), or stop what framework.py's
docstring lists (code running as the grader's own user can still reach it).
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib.util
import io
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import psutil
import torch

from dspark.course.plain_data import HEADER, Call, encode_reply, to_plain
from dspark.course.reference_guard import STUDENT_MODULE, ReferenceWatch

try:
    import resource  # POSIX only, as is os.fork: on Windows the module imports, grading refuses
except ImportError:  # pragma: no cover
    resource = None

MAX_OUTPUT_BYTES = 64 << 20  # the student's stdout + stderr file (RLIMIT_FSIZE in the check's process)
SWEEP_SECONDS = 2.0  # the most one `kill_tree` tries: a tree of thousands ends in well under that
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)  # nothing to kill, no children
_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, *_GONE)  # cannot fork


def import_solution(path: Path) -> ModuleType:
    """Execute the student's file as the module `student_solution` (its folder on sys.path)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(STUDENT_MODULE, path)
    if spec is None or spec.loader is None:  # not a .py file: nothing imports it
        raise ImportError(f"{path.name} is not a Python file (.py)")
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
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> bytes | None:
    """The next message on `fd` (blocking), or None at the end."""
    header = _read_exactly(fd, HEADER.size)
    return None if header is None else _read_exactly(fd, HEADER.unpack(header)[0])


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
    reply["reference_files"] = watch.files()
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


def run_supervisor(job: Job) -> NoReturn:
    """A new session; the check's process in it; wait for that process, end every process it left
    (this one is their subreaper: orphans come here, whatever session they moved to), then exit as
    the check's process did."""
    try:
        os.setsid()
        become_subreaper()
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
        status = _wait_for(child)
        _end_descendants()
        if os.WIFSIGNALED(status):
            _die_by(os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    finally:
        os._exit(70)


def _wait_for(child: int) -> int:
    """The wait status of `child`; the orphans re-parented here meanwhile are reaped as they end."""
    while True:
        pid, status = os.wait()
        if pid == child:
            return status


def _end_descendants(seconds: float = SWEEP_SECONDS) -> None:
    """Kill every process still below this one and reap them, within `seconds` (past that, the
    grader's own `kill_tree` and `killpg` follow)."""
    end = time.monotonic() + seconds
    while _has_children() and time.monotonic() < end:
        kill_tree([os.getpid()], max(0.0, end - time.monotonic()))
        time.sleep(0.001)  # a killed parent's children take a moment to be re-parented here


def _has_children() -> bool:
    """Reap the children that ended (without waiting); does any remain?"""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _die_by(number: int) -> NoReturn:
    """End this process by signal `number`, as the check's process did."""
    try:
        signal.signal(number, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be handled, nor need to be
        pass
    os.kill(os.getpid(), number)
    os._exit(128 + number)


# ---- every process below the supervisor ---------------------------------------------------------------
def _find_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up here, at import in the grader: a lookup (dlsym) in a process forked
    from a threaded one could wait forever on a lock another thread held. None where missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux 3.4+); False where impossible."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants(roots: Iterable[int]) -> dict[int, str]:
    """pid -> psutil status of every live process below `roots` (their children, theirs, ...)."""
    found: dict[int, str] = {}
    for root in roots:
        try:
            below = psutil.Process(root).children(recursive=True)
        except psutil.Error:  # gone, or not ours to look at
            continue
        for process in below:
            try:
                found[process.pid] = process.status()
            except psutil.Error:  # gone meanwhile
                continue
    return {pid: state for pid, state in found.items() if state not in _GONE}


def kill_tree(roots: Sequence[int], seconds: float = SWEEP_SECONDS) -> bool:
    """Freeze every live descendant of `roots` (`_freeze`, for at most half of `seconds`), then
    SIGKILL them, scan after scan, until none is left; True once none is, False if `seconds` ran
    out first. The roots themselves are left alone."""
    end = time.monotonic() + seconds
    _freeze(roots, until=end - seconds / 2)
    while tree := descendants(roots):
        for pid in tree:
            _signal(pid, signal.SIGKILL)
        if time.monotonic() > end:
            return False
        time.sleep(0.001)  # let the signals land
    return True


def _freeze(roots: Sequence[int], until: float) -> None:
    """SIGSTOP the descendants of `roots` until none can fork: each is stopped, or asleep in the
    kernel with the stop pending (state D: the parent of a stopped vfork child waits there for
    good) -- or until the time `until`."""
    sent: set[int] = set()
    while time.monotonic() < until:
        tree = descendants(roots)
        running = [
            p
            for p, state in tree.items()
            if state not in _STOPPED and not (state == psutil.STATUS_DISK_SLEEP and p in sent)
        ]
        if not running:
            return
        for pid in running:
            _signal(pid, signal.SIGSTOP)
        sent.update(running)
        time.sleep(0.001)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass
