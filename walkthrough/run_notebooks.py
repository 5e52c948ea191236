"""Execute the walkthrough notebooks in place, so that they are committed with their outputs.

    python walkthrough/run_notebooks.py            # every notebook, in order
    python walkthrough/run_notebooks.py 04 07      # the ones whose names start so

Each notebook runs top to bottom in a fresh kernel from `walkthrough/`; the executed copy
replaces the file only when every cell ran (a failing notebook is left as it was and named).
Before writing: widget state and per-cell timing metadata are dropped, cell ids are
assigned where missing, and a notebook over MAX_BYTES is refused -- tests/lab/test_notebooks.py
checks the same on the committed files.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

WALKTHROUGH = Path(__file__).resolve().parent
ROOT = WALKTHROUGH.parent  # the kernels import dspark from here, as the tests do
MAX_BYTES = 1_000_000  # a notebook with its outputs (the PNGs inline) stays under this


def is_progress_bar(output: nbformat.NotebookNode) -> bool:
    """A progress bar's output: stderr redrawn with carriage returns, or the bare newline that ends it."""
    return output.get("name") == "stderr" and ("\r" in output.text or not output.text.strip())


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes on every run and says nothing to a reader (widget state, cell timings, progress bars); give every
    cell an id."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("widgets", None)
        for output in cell.get("outputs", []):
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if not is_progress_bar(o)]
    for i, cell in enumerate(nb.cells):
        cell.setdefault("id", f"cell-{i}")  # nbformat 4.5 wants one per cell (one notebook had none)
    return nb


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """`path` executed in a fresh kernel with the walkthrough folder as its working directory."""
    nb = nbformat.read(path, as_version=4)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(WALKTHROUGH)}}).execute()  # fmt: skip
    return clean(nb)


def write(nb: nbformat.NotebookNode, path: Path) -> int:
    """Write atomically (a temporary file renamed over `path`); returns the size in bytes."""
    text = nbformat.writes(nb) + "\n"
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise ValueError(
            f"{path.name}: {size / 1e6:.2f} MB with outputs, over the {MAX_BYTES / 1e6:g} MB limit"
        )
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python walkthrough/run_notebooks.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("prefixes", nargs="*", help="run only the notebooks whose names start with these")
    args = parser.parse_args(argv)
    paths = [p for p in sorted(WALKTHROUGH.glob("*.ipynb"))
             if not args.prefixes or any(p.name.startswith(x) for x in args.prefixes)]  # fmt: skip
    if not paths:
        print(f"no notebook matches {' '.join(args.prefixes)}", file=sys.stderr)
        return 2
    failed = []
    for path in paths:
        start = time.perf_counter()
        try:
            size = write(execute(path), path)
        except (CellExecutionError, ValueError) as error:
            failed.append(path.name)
            last = re.sub(r"\x1b\[[0-9;]*m", "", str(error).strip().splitlines()[-1])  # without colours
            print(f"{path.name}: FAILED, left as it was: {last}", file=sys.stderr)
            continue
        print(f"{path.name}: {time.perf_counter() - start:.0f} s, {size / 1e3:.0f} kB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
