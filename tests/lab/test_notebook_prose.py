"""A number quoted in a walkthrough notebook's prose is a number the notebook prints (or the paper's).

Prose written after a run drifts once the run changes; this test reads the committed notebooks (nothing is
executed) and fails on every quoted number that nothing beside it backs.

What is checked ("prose"): the text of every markdown cell, and the string literals a code cell passes as a
figure's title or axis label (`set_title`, `suptitle`, `title`, `set_xlabel`, `set_ylabel`, `xlabel`, `ylabel`,
and the `title=` / `xlabel=` / `ylabel=` keywords), the f-strings' `{...}` parts left out.

What counts as "a number" there -- only what reads as a measurement:
  * a decimal with a fractional part: 0.97, 3.74, 1.3x, 5.2 M;
  * a number written with thousands separators: 2,824, 200,000;
  * a percentage: 26.7%, 30% (both ends of a range such as 3-8%).
Bare integers are never checked (gamma = 7, 16 prompts, k = 3, years, equation indices), nor are section
numbers (after a section sign or Section/Eq./Algorithm/Appendix, or opening a heading), dotted versions
(3.2.1), numbers inside links' addresses, and a confidence level ("95% Wilson interval", "95% CI").

What backs a number ("the sources"): the numbers in the notebook's outputs (stream text, and the text/plain,
text/markdown and text/html of execute results and displays) and in the committed result files it reads -- a
text file under walkthrough/results/ whose path relative to that folder is written in a code cell (after a
quote or "results/"), or each of whose path parts is a string literal there. The comparison forgives
formatting: a quoted number with d decimals matches any source value that rounds to it at d decimals (0.97
matches 0.9703 and 0.970), "2,824" matches 2824, "26.7%" matches 26.7 and 0.267, "5.2 M" matches 5,243,392;
signs are ignored.

"The paper's": a number is exempt when its clause (a sentence, or a part of one between semicolons) names the
paper as its source: "Paper" capitalised (as in "Paper Fig. 6: ..."), "paper's", "of the paper", "the paper
reports/shows/measures/finds/gives/plots", or "DeepSeek". A clause that only compares with the paper ("below
the paper at position 1, where 59% ...") is checked. Sentences end at . ! ? (and any closing markup) before a
capital or markup, and at line breaks that start a list item, a table row or a heading; so "**Check against
the paper.**" is a sentence of its own and exempts nothing after it.

Limits: a number is matched against every value of the notebook's sources, not the one it describes, so a
number of the wrong run still passes when it happens to be printed elsewhere (a large result file prints
many); what the test guarantees is that no quoted number is made up or left over from an older run.

`unmatched_numbers(path)` returns one line per offending number, for use on a single notebook:

    python -c "from tests.test_notebook_prose import unmatched_numbers as u; print(*u('walkthrough/03_x.ipynb'), sep='\\n')"
"""

from __future__ import annotations

import ast
import bisect
import re
from pathlib import Path

import nbformat
import pytest

WALKTHROUGH = Path(__file__).resolve().parents[2] / "walkthrough"
RESULTS = WALKTHROUGH / "results"
NOTEBOOKS = sorted(WALKTHROUGH.glob("*.ipynb"))
TEXT_SUFFIXES = {".json", ".md", ".txt", ".csv"}

# A number as it may be quoted in prose: thousands separators, or a fractional part, or neither (kept only with %)
PROSE_NUMBER = re.compile(
    r"(?<![\w.,/])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)(?![\w.]?\d)"
    r"(?P<pct>\s?%)?(?:\s?(?P<scale>[kKMBG])\b)?"
)
# Anything printed that reads as a number, exponent included
SOURCE_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?")
SECTION_BEFORE = re.compile(
    r"(?:§|\bSection|\bSec\.|\bEq\.|\bEquation|\bAlgorithm|\bAppendix|\bv|\bPython|\bPyTorch)\s*\(?\s*$"
)
RANGE_TO_PERCENT = re.compile(r"\s*[–-]\s*\d+(?:\.\d+)?\s?%")  # the "3" of "3–8%" is a percentage too
CONFIDENCE_LEVEL = re.compile(r"^\s?%\s+(?:[\w-]+\s+){0,2}(?:interval|CI|confidence|bootstrap)", re.I)
# the paper named as the source of what follows, not merely compared with
PAPER = re.compile(
    r"\bPaper\b|\bpaper's|\bof the paper\b|\bpaper (?:reports|shows|measures|finds|gives|plots)\b|DeepSeek"
)
SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
FIGURE_CALLS = {"set_title", "suptitle", "title", "set_xlabel", "set_ylabel", "xlabel", "ylabel"}
FIGURE_KEYWORDS = {"title", "xlabel", "ylabel"}
ABBREVIATIONS = re.compile(r"(?:\be\.g|\bi\.e|\bvs|\bcf|\bFig|\bEq|\bapprox|\betc)\.[*_]*$")
SENTENCE_END = re.compile(r"([.!?][*_)\"”]*)\s+(?=[A-Z*_(\[\"“`§])")


def sentences(text: str) -> list[str]:
    """`text` split into sentences: after . ! ? (and any closing markup) before a capital or markup, and at
    list items, table rows and headings."""
    text = re.sub(r"\]\([^)]*\)", "]", text)  # a link's address is not prose
    found: list[str] = []
    for block in re.split(r"\n(?=\s*(?:[-*+]\s|\d+\.\s|\||#))|\n\s*\n", text):
        start = 0
        for end in SENTENCE_END.finditer(block):
            piece = block[start : end.end(1)]
            if ABBREVIATIONS.search(piece):
                continue  # "e.g. The": not the end of a sentence
            found.append(piece)
            start = end.end()
        found.append(block[start:])
    return [" ".join(s.split()) for s in found if s.strip()]


def quoted_numbers(sentence: str) -> list[tuple[str, list[tuple[float, float]]]]:
    """The numbers `sentence` quotes, each with the (value, half-width) intervals a source value may fall in."""
    found = []
    for m in PROSE_NUMBER.finditer(sentence):
        text = m.group("num")
        is_pct = bool(m.group("pct") or RANGE_TO_PERCENT.match(sentence, m.end()))
        if not ("." in text or "," in text or is_pct):
            continue  # a bare integer
        before = sentence[: m.start()]
        if SECTION_BEFORE.search(before) or re.fullmatch(r"\s*#+\s*", before):
            continue  # a section number
        if is_pct and CONFIDENCE_LEVEL.match(sentence[m.end("num") :]):
            continue  # "95% interval": a level chosen, not measured
        value = float(text.replace(",", ""))
        decimals = len(text.split(".")[1]) if "." in text else 0
        half = 0.5 * 10.0**-decimals
        windows = [(value, half)]
        if is_pct:
            windows.append((value / 100, half / 100))
        if m.group("scale"):
            factor = SCALE[m.group("scale")]
            windows.append((value * factor, half * factor))
        shown = text + ("%" if is_pct else "") + (m.group("scale") or "")
        found.append((shown, windows))
    return found


def source_values(text: str) -> list[float]:
    """Every number printed in `text`, a percentage also as a fraction."""
    values = []
    for m in SOURCE_NUMBER.finditer(text):
        value = float(m.group(0).replace(",", ""))
        values.append(value)
        if text[m.end() : m.end() + 1] == "%":
            values.append(value / 100)
    return values


def output_text(cell: nbformat.NotebookNode) -> str:
    """What a code cell printed: stream text and the textual representations of its results."""
    texts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            texts.append(output.text)
        for kind in ("text/plain", "text/markdown", "text/html"):
            texts.append(output.get("data", {}).get(kind, ""))
    return "\n".join(texts)


def read_results(code: str) -> list[Path]:
    """The committed result files under walkthrough/results/ that `code` names."""
    literals = set(re.findall(r"[\"']([^\"'\n]+)[\"']", code))
    named = []
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        rel = path.relative_to(RESULTS).as_posix()
        spelled = re.search(r"(?:[\"']|results/)" + re.escape(rel) + r"[\"']", code)
        if spelled or all(part in literals for part in rel.split("/")):
            named.append(path)
    return named


def figure_labels(code: str) -> list[str]:
    """The string literals `code` passes as a figure's title or axis label (f-strings without their fields)."""
    source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []

    def text_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
        return None

    labels = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = list(node.args) if name in FIGURE_CALLS else []
        args += [k.value for k in node.keywords if k.arg in FIGURE_KEYWORDS]
        labels += [t for t in map(text_of, args) if t]
    return labels


def unmatched_numbers(path: str | Path) -> list[str]:
    """One line per number quoted in `path`'s prose that none of its outputs or result files prints:
    "cell N: NUMBER not printed -- SENTENCE"."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    # the sources: outputs, then the result files the code reads
    texts = [output_text(c) for c in nb.cells if c.cell_type == "code"]
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in read_results(code)]
    values = sorted(v for t in texts for v in source_values(t))
    # the prose: markdown cells, and figure titles and labels set in code
    prose = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    prose += [
        (i, label)
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for label in figure_labels(c.source)
    ]
    problems = []
    for index, text in prose:
        for sentence in sentences(text):
            for clause in sentence.split(";"):
                if PAPER.search(clause):
                    continue  # the paper's numbers
                for shown, windows in quoted_numbers(clause):
                    if not any(printed(values, centre, half) for centre, half in windows):
                        problems.append(f"cell {index}: {shown} not printed -- {sentence}")
    return problems


def printed(values: list[float], centre: float, half: float) -> bool:
    """Whether a sorted `values` holds one within `half` of `centre` (a hair of slack for float noise)."""
    slack = half * (1 + 1e-9) + 1e-12
    i = bisect.bisect_left(values, centre - slack)
    return i < len(values) and values[i] <= centre + slack


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_prose_numbers_are_printed(path: Path) -> None:
    """Every number a notebook's prose quotes is in its outputs or its result files, or is the paper's."""
    problems = unmatched_numbers(path)
    assert not problems, f"{path.name}: numbers in prose that no output prints:\n" + "\n".join(problems)


def tiny_notebook(tmp_path: Path, prose: str, printed_text: str) -> Path:
    """A two-cell notebook: a code cell that printed `printed_text`, and a markdown cell saying `prose`."""
    code = nbformat.v4.new_code_cell("print(x)", execution_count=1)
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed_text)]
    nb = nbformat.v4.new_notebook(cells=[code, nbformat.v4.new_markdown_cell(prose)])
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_checker_fails_on_a_planted_wrong_number(tmp_path: Path) -> None:
    """The output says 0.97, the prose 0.79: reported, with its cell and sentence."""
    path = tiny_notebook(tmp_path, "The drafter keeps 0.79 at position 2.", "acceptance at k = 2: 0.97\n")
    assert unmatched_numbers(path) == ["cell 1: 0.79 not printed -- The drafter keeps 0.79 at position 2."]


def test_checker_passes_the_right_number(tmp_path: Path) -> None:
    path = tiny_notebook(tmp_path, "The drafter keeps 0.97 at position 2.", "acceptance at k = 2: 0.97\n")
    assert unmatched_numbers(path) == []


@pytest.mark.parametrize(
    ("prose", "output"),
    [
        ("It keeps 0.970 of them.", "0.97"),
        ("It keeps 0.97 of them.", "0.9703"),
        ("ECE falls to 26.7%.", "ece 0.267"),
        ("ECE falls to 26.7%.", "ece 26.7%"),
        ("The run drew 2,824 rounds.", "rounds: 2824"),
        ("A 1.3× speed-up.", "ratio 1.27"),
        ("A 5.2 M-parameter target.", "5,243,392 parameters"),
        ("See §3.1 and γ = 7, k = 3, in 2025, with a 95% Wilson interval.", "nothing"),
        ("The paper reports 0.87 → 0.78 on code.", "nothing"),
        ("Paper Fig. 6: ECE of 3–8% before STS.", "nothing"),
        ("Fig. 2 of the paper shows 0.87 → 0.78 on code.", "nothing"),
    ],
)
def test_checker_forgives_formatting_only(tmp_path: Path, prose: str, output: str) -> None:
    assert unmatched_numbers(tiny_notebook(tmp_path, prose, output)) == []


@pytest.mark.parametrize(
    ("prose", "output"),
    [
        ("It keeps 0.97 of them.", "0.96"),
        ("ECE falls to 26.7%.", "ece 0.276"),
        ("**Check against the paper.** Here it keeps 0.79.", "0.97"),
        ("The paper's curves are on a 4 B target; here every drafter accepts 0.79.", "0.97"),
        ("It keeps 0.79 (below the paper at position 1).", "0.97"),
        ("Ranges: 3–8% before.", "ece 3.0 and 7.0"),
    ],
)
def test_checker_catches(tmp_path: Path, prose: str, output: str) -> None:
    assert unmatched_numbers(tiny_notebook(tmp_path, prose, output))


def test_checker_reads_figure_titles(tmp_path: Path) -> None:
    """A number in a title set in code is prose: checked like markdown."""
    path = tiny_notebook(tmp_path, "No numbers here.", "0.97")
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source = 'ax.set_title(f"acceptance {x:.2f}, was 0.79")\nax.set(xlabel="k (0.97 at 2)")'
    nbformat.write(nb, path)
    assert [line.split(" --")[0] for line in unmatched_numbers(path)] == ["cell 0: 0.79 not printed"]
