"""Ctrl-C while a `python -m dspark.<command>` is still starting: `interrupted` and exit status 130.

`dspark.lab.cli.run_main` turns a KeyboardInterrupt inside a command into that line, but a
command spends its first second or two importing torch -- in `dspark/__init__.py`
and at the top of the command's module, before `run_main` runs -- and an
interrupt there used to end in a traceback. Importing this module (the package's
`__init__` does, before anything heavy) calls `install`, which -- only when the
process was started as `python -m dspark...` -- sets a `sys.excepthook` that reports an uncaught
KeyboardInterrupt the same way and exits 130; every other exception goes to the
hook that was there before. A program that merely imports dspark keeps Python's
own behaviour.

This module imports nothing but the standard library, so that it is in place before
torch starts loading.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import TracebackType

INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def launched_as_command(argv: Sequence[str] | None = None) -> bool:
    """Whether the interpreter was started as `python -m dspark` or `python -m dspark.<command>`."""
    argv = list(getattr(sys, "orig_argv", []) if argv is None else argv)
    for arg, after in zip(argv, [*argv[1:], ""]):
        if arg.startswith("-m"):  # `-m NAME` or `-mNAME`: the module Python runs
            module = after if arg == "-m" else arg[2:]
            return module == "dspark" or module.startswith("dspark.")
    return False


def report_interrupt(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """sys.excepthook: an uncaught KeyboardInterrupt is one `interrupted` line and exit status 130."""
    if not issubclass(kind, KeyboardInterrupt):
        previous_hook(kind, value, tb)
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe or a closed stream: nothing more to say there
        pass
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED_STATUS)  # sys.exit is not allowed in an excepthook; Python would re-raise SIGINT


previous_hook = sys.excepthook


def install() -> None:
    """Set `report_interrupt` as sys.excepthook when running as a dspark command (see the module docstring)."""
    global previous_hook
    if launched_as_command() and sys.excepthook is not report_interrupt:
        previous_hook, sys.excepthook = sys.excepthook, report_interrupt


install()
