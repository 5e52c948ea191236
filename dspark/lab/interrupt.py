"""Ctrl-C while a command is still importing (torch takes seconds): one line, `interrupted`, exit status 130,
instead of a traceback through torch's import machinery. Imported first by every `python -m dspark.<command>`
(dspark/<command>.py), before anything imports torch; it imports nothing heavy itself.
"""

from __future__ import annotations

import os
import sys


def _interrupted(
    kind: type[BaseException], value: BaseException, tb: object, previous=sys.excepthook
) -> None:
    """KeyboardInterrupt: `interrupted`, exit status 130; every other error goes to the previous hook."""
    if not issubclass(kind, KeyboardInterrupt):
        return previous(kind, value, tb)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
        pass
    print("interrupted", file=sys.stderr, flush=True)
    os._exit(130)  # 128 + SIGINT; sys.exit is not allowed in an excepthook


# only for `python -m dspark...`: a Python session that merely imports a command keeps its own Ctrl-C
_argv = getattr(sys, "orig_argv", [])
_module = next((a[2:] or b for a, b in zip(_argv, [*_argv[1:], ""]) if a.startswith("-m")), "")
if _module == "dspark" or _module.startswith("dspark."):
    sys.excepthook = _interrupted
