"""`CheckProcess`: the grader's handle on one check's process -- send a call, get its reply, kill it.

`CheckProcess(path, timeout)` forks the supervisor of dspark/course/sandbox.py and keeps the
two pipes' grader ends, non-blocking, and a deadline. `call` pickles one `Call` to the check's
process and waits for its reply; every wait looks at the deadline (`TimedOut`) and at the
supervisor (`ProcessEnded`, "the check's process died without a reply (exit status 3)"), and
a reply too large, unreadable or not fitting its call is `BadReply`; after any of them the
process is no longer `healthy`. `close` (also on leaving a `with`) ends the check's process
(by pidfd, wherever it went) and every process it started, whatever session or group it moved
to (the supervisor is their subreaper, and `kill_tree` sweeps what it may have left: see
dspark/course/sandbox.py), then the whole process group, reaps the supervisor, removes the
scratch folder and keeps the last lines the student's code printed (`output`), made printable.

What this file does not do: run the student's code (dspark/course/sandbox.py) or decide what
a reply means for the check (dspark/course/checks.py, framework.py).
"""

from __future__ import annotations

import math
import os
import pickle
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from dspark.course.expect import printable
from dspark.course.plain_data import HEADER, BadReply, Call, decode_reply
from dspark.course.sandbox import SWEEP_SECONDS, Job, kill_tree, run_supervisor

MAX_REPLY_BYTES = 256 << 20  # one reply: far more than any check's answers
_POLL = 0.05  # seconds between looks at the supervisor while waiting on a pipe


class TimedOut(Exception):
    """The check's deadline passed."""


class ProcessEnded(Exception):
    """The check's process died or closed its pipe; the message says how ("exit status 3")."""


class CheckProcess:
    """One check's process as the grader sees it: `call`, then `close` (also on leaving a `with`)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.scratch = Path(tempfile.mkdtemp(prefix="dspark-grade-"))
        self.output_file = tempfile.TemporaryFile()
        self.reference: list[str] = []  # reference modules the student's code imported
        self.reference_files: list[str] = []  # files of the reference folder it opened
        self.output = ""  # what it printed, once closed
        self.healthy = True  # False once it timed out, died or sent something unreadable
        self.imported: dict | None = None
        self._child_pid: int | None = None
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
            run_supervisor(job)
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
        self._write(HEADER.pack(len(data)) + data)
        reply = self._receive()
        if not _fits(reply, call):
            raise self._bad(BadReply("the check's process sent back a reply that does not fit the call"))
        return reply

    def _receive(self) -> dict:
        try:
            header = self._read(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > MAX_REPLY_BYTES:
                raise BadReply(f"the check's process sent back garbage (a message of {size} bytes announced)")
            reply = decode_reply(self._read(size))
        except (TimedOut, ProcessEnded, BadReply) as exc:
            raise self._bad(exc) from None
        self.reference = _merged(self.reference, reply.get("reference"))
        self.reference_files = _merged(self.reference_files, reply.get("reference_files"))
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
        self._child_pid = pid
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
        """End the check's process and every process it started; collect the output; clean up."""
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
        """Stop the check's process (by pidfd: found even outside its group); SIGKILL every process
        below the supervisor, or below the check's process should the supervisor have died first
        (`kill_tree`); SIGKILL the check's process and let the supervisor reap it (no zombie left
        behind); then SIGKILL the whole group (all there is where /proc is missing), and reap the
        supervisor."""
        roots = [self.supervisor]  # not reaped yet: its pid, and its group id, belong to no one else
        if self._signal_child(signal.SIGSTOP):  # still there (not reaped): its pid is its own
            roots.append(self._child_pid)
        kill_tree(roots)
        if self._child_pidfd is not None:
            self._signal_child(signal.SIGKILL)
            os.close(self._child_pidfd)
            self._child_pidfd = None
        self._await_supervisor(SWEEP_SECONDS)  # it sweeps what is left below it, then exits
        try:
            os.killpg(self.supervisor, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        os.waitpid(self.supervisor, 0)
        if self._supervisor_fd is not None:
            os.close(self._supervisor_fd)

    def _signal_child(self, number: int) -> bool:
        """Send signal `number` to the check's process by its pidfd; False if it is gone (or no pidfd)."""
        if self._child_pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self._child_pidfd, number)
        except OSError:
            return False
        return True


def _merged(names: list[str], more: object) -> list[str]:
    """`names` and the strings of `more` (a list a reply carried, if it is one), sorted, once each."""
    return sorted({*names, *(str(n) for n in more)}) if isinstance(more, list) else names


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


def read_output(file: BinaryIO, max_lines: int = 20, max_chars: int = 200) -> str:
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
