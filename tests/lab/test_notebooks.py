"""Every walkthrough notebook executes top to bottom without errors, and is committed with its outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dspark.lab.pretrained.fetch import models_dir

WALKTHROUGH = Path(__file__).resolve().parents[2] / "walkthrough"
NOTEBOOKS = sorted(WALKTHROUGH.glob("*.ipynb"))
sys.path.insert(0, str(WALKTHROUGH))  # run_notebooks.py: the command that executes them in place


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    """Top to bottom, and from a checkout alone: with an empty DSPARK_HOME (but for the fetched models and data
    sets, which are inputs), so what a notebook shows never comes from a cache of the machine it ran on -- a
    notebook that measures and caches something there fails."""
    if path.name == "08_kernels.ipynb":
        pytest.importorskip("triton")  # the kernels walkthrough needs Triton (absent on macOS)
    home = tmp_path / "dspark_home"
    home.mkdir()
    for fetched in ("models", "datasets"):  # what `python -m dspark.fetch` downloaded: inputs, kept
        if (models_dir().parent / fetched).is_dir():
            (home / fetched).symlink_to(models_dir().parent / fetched)
    monkeypatch.setenv("DSPARK_HOME", str(home))
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(WALKTHROUGH)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors
    cached = sorted(p.name for p in home.iterdir() if p.name not in ("models", "datasets"))
    assert not cached, (
        f"{path.name} used DSPARK_HOME ({cached}): read committed files or measure in the notebook"
    )


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


def test_a_notebook_that_caches_in_dspark_home_fails(tmp_path, monkeypatch):
    """The check above fails on a notebook that leaves something in DSPARK_HOME (as one that measured a profile
    and cached it would)."""
    code = "import os, pathlib\npathlib.Path(os.environ['DSPARK_HOME'], 'profiles').mkdir()"
    path = tmp_path / "caches.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), path)
    with pytest.raises(AssertionError, match="used DSPARK_HOME"):
        test_notebook_executes(path, tmp_path, monkeypatch)
