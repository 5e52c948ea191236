"""dspark/lab/interrupt.py: Ctrl-C while `python -m dspark.<command>` is still importing is one line, exit 130
(every command imports the hook first, and `import dspark` loads no torch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.parametrize("after", ["torch.", "dspark.engine"])
def test_ctrl_c_while_importing_is_one_line_and_130(small_checkpoint, tmp_path, after):
    """SIGINT once `-X importtime` reports a module `after` imported: inside torch's own import (the command's
    first import is the hook, the next ones load torch) or after it, before the command's main runs. Timing-tolerant: the signal is
    sent on that line, wherever the process has got to by then it must end the same way."""
    argv = [sys.executable, "-X", "importtime", "-m", "dspark.generate", "hi", "--checkpoint", str(small_checkpoint),
            "--drafter", "none", "--max-new-tokens", "100"]  # fmt: skip
    env = {**os.environ, "DSPARK_HOME": str(tmp_path)}
    # the child starts with SIGINT's default action even when these tests run in a background job (`pytest &`),
    # whose children inherit an ignored SIGINT from the shell: Python then keeps it ignored and Ctrl-C does nothing
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        for line in proc.stderr:
            if line.startswith("import time:") and line.rstrip().split("|")[-1].strip().startswith(after):
                proc.send_signal(signal.SIGINT)
                break
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    said = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("import time:")]
    assert proc.returncode == 130 and said == ["interrupted"], (proc.returncode, rest[-2000:])


def test_import_dspark_loads_no_torch():
    """The package's names load on first use, so the hook can come before torch."""
    code = "import sys, dspark; assert 'torch' not in sys.modules; dspark.SamplingParams; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_session_that_imports_a_command_keeps_its_own_ctrl_c():
    """Only `python -m dspark.<command>` swaps the hook: a REPL or notebook importing dspark.bench must not be
    ended by its next Ctrl-C."""
    code = "import sys, dspark.bench; assert sys.excepthook is sys.__excepthook__"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
