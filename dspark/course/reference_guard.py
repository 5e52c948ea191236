"""Catching a solution that uses the instructor's reference solution (dspark/course/reference/).

Twice: before anything runs, `reference_flag` reads the file's source (nothing executed): a copy
of a reference file -- the same tokens once comments, docstrings, blank lines and indentation
widths are set aside (`code_tokens`) -- or an import of the reference package or a call that
names it (`importlib.import_module(...)`, a path to it, `ast`), and every check then fails; while
a check runs, `ReferenceWatch`, installed in the check's process, notes every reference module
imported (an import hook: by name, or loaded from the reference folder under another) and every
file of the reference folder opened (an audit hook on "open": read, exec-ed, copied, by whatever
path), and that check fails with `reference_used`. Grading the reference adapters themselves
(`python -m dspark.grade N --reference`) is neither.

What this cannot see (walkthrough/assignments/INSTRUCTORS.md): code retyped or paraphrased from
the reference (any change beyond comments and layout), or a file read where Python's audit hooks
do not look (a child process such as `cat`, libc called through ctypes).
What this file does not do: run the check's process (dspark/course/sandbox.py installs the
watch there) or keep a student from reading the reference files (the handouts forbid it).
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import io
import os
import sys
import tokenize
from pathlib import Path
from types import ModuleType

from dspark.course.expect import one_line

STUDENT_MODULE = "student_solution"  # the name the check's process imports the student's file under
REFERENCE_PACKAGE = "dspark.course.reference"
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
_SHOWN_FROM = REFERENCE_DIR.parents[2]  # the folder that holds dspark/: files shown as dspark/course/...


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
    (importlib.import_module("..."), a path to it): "line N: dspark.course.reference...".
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
    return "course.reference" in dotted  # REFERENCE_PACKAGE, or the same from dspark/ on


def code_tokens(source: bytes) -> tuple[tuple[int, str], ...] | None:
    """The source's tokens (type, text) without comments, docstrings (a statement that is only a
    string), blank lines or the width of indentation; None if it does not tokenize."""
    try:
        tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None
    indentation = (tokenize.INDENT, tokenize.DEDENT)
    layout = (*indentation, tokenize.NEWLINE)
    kept: list[tuple[int, str]] = []
    statement: list[tuple[int, str]] = []
    for token in tokens:
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        statement.append((token.type, "" if token.type in layout else token.string))
        if token.type == tokenize.NEWLINE:
            words = [t for t in statement if t[0] not in layout]
            if all(t[0] == tokenize.STRING for t in words):  # a docstring: keep only its indentation
                statement = [t for t in statement if t[0] in indentation]
            kept += statement
            statement = []
    return tuple(kept + statement)


@functools.cache
def _reference_tokens() -> dict[str, tuple[tuple[int, str], ...]]:
    """Every reference solution's `code_tokens`, by its path (dspark/course/reference/aN_....py)."""
    files = sorted(p for p in REFERENCE_DIR.glob("*.py") if p.name != "__init__.py")
    return {p.relative_to(_SHOWN_FROM).as_posix(): code_tokens(p.read_bytes()) for p in files}


def reference_copy(path: Path) -> str:
    """The reference file the solution's source copies (comments and layout aside), else ""."""
    try:
        tokens = code_tokens(Path(path).read_bytes())
    except OSError:
        return ""
    if not tokens:
        return ""
    return next((name for name, theirs in _reference_tokens().items() if theirs == tokens), "")


def reference_flag(path: Path) -> str:
    """The failure every check gets when the source copies or imports the reference solution, else ""."""
    if inside(path, REFERENCE_DIR):
        return ""  # grading the reference itself (--reference)
    copied = reference_copy(path)
    if copied:
        return (
            f"uses the instructor's reference solution (a copy of {copied}, comments and layout aside); "
            "the handouts forbid it"
        )
    found = reference_imports(path)
    if not found:
        return ""
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return f"uses the instructor's reference solution ({found[0]}{more}); the handouts forbid it"


# ---- while a check runs, in its process ---------------------------------------------------------------
class ReferenceWatch(importlib.abc.MetaPathFinder):
    """An import hook that notes every import of the reference package, and an audit hook that
    notes every file of the reference folder opened (and both let it happen)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.opened: set[str] = set()  # real paths of the reference folder's files opened
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
        grading = sys.modules.get("dspark.course")
        if grading is not None and hasattr(grading, "reference"):
            delattr(grading, "reference")
        self._before = set(sys.modules)
        sys.meta_path.insert(0, self)
        sys.addaudithook(self._audit)  # for good: an audit hook cannot be removed (install it in a child)

    def _audit(self, event: str, args: tuple) -> None:
        """On "open" (open(), os.open, io.open_code, what pathlib and runpy use): note a file of the
        reference folder, by its real path (a relative path, a symlink, `..` resolved)."""
        if event != "open" or not args or not isinstance(args[0], (str, bytes)):
            return  # (a descriptor: opened before, by path)
        try:
            real = os.path.realpath(os.fsdecode(args[0]))
            if Path(real).is_relative_to(REFERENCE_DIR):
                self.opened.add(real)
        except Exception:  # noqa: BLE001, S110 - an audit hook must never make the open fail
            pass

    def report(self) -> list[str]:
        """The reference modules imported so far: by name, or loaded from the reference folder
        under another name (searched among the modules loaded since `install`)."""
        for name in sys.modules.keys() - self._before:
            module = sys.modules.get(name)
            if is_reference(name) or (name != STUDENT_MODULE and _from_reference_dir(module)):
                self.seen.add(name)
        return sorted(self.seen)

    def files(self) -> list[str]:
        """The reference folder's files opened so far, each shown as dspark/course/reference/..."""
        return sorted(Path(p).relative_to(_SHOWN_FROM).as_posix() for p in self.opened)


def _from_reference_dir(module: ModuleType) -> bool:
    origin = getattr(module, "__file__", None)
    if not isinstance(origin, str) or "reference" not in origin:  # the cheap test first
        return False
    return inside(Path(origin), REFERENCE_DIR)


def reference_used(modules: list[str], files: list[str] | None = None) -> str:
    """The failure of a check during which the student's code imported these reference modules, or
    (when it imported none: an import opens the module's file too) opened these reference files."""
    deepest = [n for n in modules if not any(m.startswith(n + ".") for m in modules)]
    what = f"imported {', '.join(deepest)}" if deepest else f"read {', '.join(files or [])}"
    return one_line(f"uses the instructor's reference solution: {what} (the handouts forbid it)")
