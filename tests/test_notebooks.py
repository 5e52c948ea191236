"""Every walkthrough notebook executes top to bottom without errors."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

WALKTHROUGH = Path(__file__).resolve().parents[1] / "walkthrough"
NOTEBOOKS = sorted(WALKTHROUGH.glob("*.ipynb"))


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
