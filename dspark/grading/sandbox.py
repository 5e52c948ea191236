"""The check's process: where the student's code runs, and nothing of the grader's verdict does.

`CheckProcess` (dspark/grading/check_process.py) forks `run_supervisor`, which starts a new
session (its own process group) and forks the check's process (`_check_process`): that one moves
into a fresh scratch folder, sends its stdout and stderr to a file the grader reads, closes every
other descriptor it inherited, installs the `ReferenceWatch`, imports the student's file as
`student_solution` and serves `Call`s: a pickle on one pipe in, a reply (plain data,
dspark/grading/plain_data.py) on another out, until the grader closes the requests' pipe. Each
reply says what the call returned or raised (type, message, where in the student's file), the
probes' logs, and the reference modules imported so far. The supervisor only waits for the
check's process and exits as it did, so a student that kills its parent kills the supervisor,
not the grader. Needs os.fork and the POSIX `resource` module (Linux, macOS).

What this file does not do: judge anything (the grader does, dspark/grading/framework.py),
enforce the time limit or kill what is left (dspark/grading/check_process.py), or stop what
framework.py's docstring lists (code running as the grader's own user can still reach it).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import io
import os
import pickle
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import torch

from dspark.grading.plain_data import HEADER, Call, encode_reply, to_plain
from dspark.grading.reference_guard import STUDENT_MODULE, ReferenceWatch

try:
    import resource  # POSIX only, as is os.fork: on Windows the module imports, grading refuses
except ImportError:  # pragma: no cover
    resource = None

MAX_OUTPUT_BYTES = 64 << 20  # the student's stdout + stderr file (RLIMIT_FSIZE in the check's process)


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
