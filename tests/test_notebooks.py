"""Every walkthrough notebook executes top to bottom without errors, and is committed with its outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

WALKTHROUGH = Path(__file__).resolve().parents[1] / "walkthrough"
NOTEBOOKS = sorted(WALKTHROUGH.glob("*.ipynb"))
sys.path.insert(0, str(WALKTHROUGH))  # run_notebooks.py: the command that executes them in place


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    if path.name == "08_kernels.ipynb":
        pytest.importorskip("triton")  # the kernels walkthrough needs Triton (absent on macOS)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(WALKTHROUGH)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_with_its_outputs(path):
    """Read on the web, a notebook shows what it computed: every code cell was executed (in order, by
    `python walkthrough/run_notebooks.py`), the last one with output, a figure or a table somewhere; no widget
    state; under the size limit."""
    from run_notebooks import MAX_BYTES

    assert path.stat().st_size <= MAX_BYTES, f"{path.name} is over {MAX_BYTES} bytes"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    unexecuted = [i for i, c in enumerate(code) if c.execution_count is None]
    assert not unexecuted, (
        f"{path.name}: code cells {unexecuted} have no outputs: run walkthrough/run_notebooks.py"
    )
    counts = [c.execution_count for c in code]
    assert counts == sorted(counts), f"{path.name}: cells were executed out of order"
    assert code[-1].outputs, f"{path.name}: the last code cell shows nothing"
    shown = {k for c in code for o in c.outputs for k in o.get("data", {})}
    assert shown & {"image/png", "text/markdown", "text/html"}, f"{path.name}: no figure or table"
    assert "widgets" not in nb.metadata


def test_committed_notebook_checker_catches_a_bare_notebook(tmp_path):
    """The check above fails on a notebook with its outputs cleared (the state the issue found them in)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    path = tmp_path / "bare.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="no outputs"):
        test_notebook_is_committed_with_its_outputs(path)
