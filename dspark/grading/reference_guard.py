"""Catching a solution that uses the instructor's reference solution (dspark/grading/reference/).

Twice: before anything runs, `reference_flag` reads the file's source (`ast`, nothing executed)
for an import of the reference package or a call that names it (`importlib.import_module(...)`,
a path to it), and every check then fails; while a check runs, `ReferenceWatch`, an import hook
installed in the check's process, notes every reference module imported (by name, or loaded
from the reference folder under another), and that check fails with `reference_used`. Grading
the reference adapters themselves (`python -m dspark.grade N --reference`) is neither.

What this file does not do: run the check's process (dspark/grading/sandbox.py installs the
watch there) or keep a student from reading the reference files (the handouts forbid it).
"""

from __future__ import annotations

import ast
import importlib.abc
import sys
from pathlib import Path
from types import ModuleType

from dspark.grading.expect import one_line

STUDENT_MODULE = "student_solution"  # the name the check's process imports the student's file under
REFERENCE_PACKAGE = "dspark.grading.reference"
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


def is_reference(module: str) -> bool:
    return module == REFERENCE_PACKAGE or module.startswith(REFERENCE_PACKAGE + ".")


def inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder)
    except (OSError, RuntimeError):
        return False


# ---- in the source, before anything runs -------------------------------------------------------------
def reference_imports(path: Path) -> list[str]:
    """Where the file's source imports the reference package, or names it in a call
    (importlib.import_module("..."), a path to it): "line N: dspark.grading.reference...".
    A file that does not parse has none (check_imports reports it)."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call):
            arguments = [*node.args, *(k.value for k in node.keywords)]
            names = [a.value for a in arguments if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        else:
            continue
        hit = next((n for n in names if _names_reference(n)), None)
        if hit is not None:
            found.append(f"line {node.lineno}: {one_line(hit, 100)}")
    return found


def _names_reference(text: str) -> bool:
    dotted = text.replace("/", ".").replace("\\", ".")
    return "grading.reference" in dotted  # REFERENCE_PACKAGE, or the same from dspark/ on


def reference_flag(path: Path) -> str:
    """The failure every check gets when the source imports the reference solution, else ""."""
    if inside(path, REFERENCE_DIR):
        return ""  # grading the reference itself (--reference)
    found = reference_imports(path)
    if not found:
        return ""
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return f"uses the instructor's reference solution ({found[0]}{more}); the handouts forbid it"


# ---- while a check runs, in its process ---------------------------------------------------------------
class ReferenceWatch(importlib.abc.MetaPathFinder):
    """An import hook that notes every import of the reference package (and lets it happen)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._before: set[str] = set()  # the modules loaded when the watch began

    def find_spec(self, fullname: str, path=None, target=None):
        if is_reference(fullname):
            self.seen.add(fullname)
        return None

    def install(self) -> None:
        """Forget the reference modules the grader had loaded, so that any import of them is seen."""
        for name in [n for n in sys.modules if n.startswith(REFERENCE_PACKAGE)]:
            if is_reference(name):
                del sys.modules[name]
        grading = sys.modules.get("dspark.grading")
        if grading is not None and hasattr(grading, "reference"):
            delattr(grading, "reference")
        self._before = set(sys.modules)
        sys.meta_path.insert(0, self)

    def report(self) -> list[str]:
        """The reference modules imported so far: by name, or loaded from the reference folder
        under another name (searched among the modules loaded since `install`)."""
        for name in sys.modules.keys() - self._before:
            module = sys.modules.get(name)
            if is_reference(name) or (name != STUDENT_MODULE and _from_reference_dir(module)):
                self.seen.add(name)
        return sorted(self.seen)


def _from_reference_dir(module: ModuleType) -> bool:
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str) or "reference" not in origin:  # the cheap test first
        return False
    return inside(Path(origin), REFERENCE_DIR)


def reference_used(modules: list[str]) -> str:
    """The failure of a check during which the student's code imported these reference modules."""
    deepest = [n for n in modules if not any(m.startswith(n + ".") for m in modules)]
    return one_line(
        f"uses the instructor's reference solution: imported {', '.join(deepest)} (the handouts forbid it)"
    )
