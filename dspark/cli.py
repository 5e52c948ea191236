"""Shared command-line plumbing: clean errors instead of tracebacks.

Every `python -m dspark.<command>` entry point runs through `run_main`. Errors
a user can cause (bad arguments, missing or corrupt files, prompts that do not
fit) are raised as `UsageError`, `CheckpointError`, `FileNotFoundError` or
`ValueError` deep inside the library and printed here as one line on stderr
with a non-zero exit status. Ctrl-C exits quietly with status 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dspark.checkpoint import CheckpointError


class UsageError(Exception):
    """The user asked for something that cannot be done; the message says why."""


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    try:
        return main(argv) or 0
    except (UsageError, CheckpointError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
