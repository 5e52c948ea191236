"""The front-door documents stay short and their links stay alive.

* README.md is for a learner: at most 350 lines; every other number lives in walkthrough/RESULTS.md.
* Every relative link (and image) in README.md, walkthrough/RESULTS.md and the READMEs of the result folders
  points at a file or folder that exists; a `#anchor` into a markdown file names one of its headings
  (GitHub's rule: lower case, punctuation dropped, spaces to hyphens). Web links are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "walkthrough" / "RESULTS.md"
DOCS = [README, RESULTS, *sorted((ROOT / "walkthrough" / "results").rglob("README.md"))]
MAX_README_LINES = 350

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """Every markdown link target outside code (fenced blocks and inline code)."""
    return LINK.findall(CODE.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[*_`]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings, repeated ones numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path) -> list[str]:
    problems = []
    for target in links(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            problems.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{target}: no heading with that anchor")
    return problems


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (limit {MAX_README_LINES}): move the numbers that are not headline "
        "numbers into walkthrough/RESULTS.md"
    )


def test_readme_keeps_its_first_commands():
    """tests/lab/test_cli.py and CI run what the first code block says."""
    block = README.read_text(encoding="utf-8").split("```", 2)[1]
    assert "pip install -r requirements.txt && python -m dspark.generate" in block
    assert "python -m pytest -q" in block


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_links_point_at_existing_files(doc):
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    problems = broken_links(doc)
    assert not problems, f"broken links in {doc.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_docs_link_checker_finds_broken_links(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with punctuation!\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md) [ok](other.md#a-heading-with-punctuation) [ok](other.md#twice-1) [web](https://x.y/z)\n"
        "![missing](nope.png) [bad anchor](other.md#nowhere) `[in code](ignored.md)`\n"
        "```\n[in a block](ignored.md)\n```\n"
    )
    assert broken_links(doc) == ["nope.png: no such file", "other.md#nowhere: no heading with that anchor"]


READING_ROW = re.compile(r"^\| *\d+ *\| *`([^`]+)` *\| *([\d,]+) *\|", re.M)


def test_reading_path_line_counts_match_the_files():
    """The reading path's line counts (and its total) are within 10% of the files as they are."""
    text = README.read_text(encoding="utf-8")
    rows = READING_ROW.findall(text)
    assert len(rows) >= 10, "the reading path table was not found"
    wrong = []
    for path, stated in rows:
        actual = len((ROOT / path).read_text(encoding="utf-8").splitlines())
        if abs(actual - int(stated.replace(",", ""))) > 0.1 * actual:
            wrong.append(f"{path}: README says {stated}, the file has {actual}")
    assert not wrong, "; ".join(wrong)
    total = re.search(r"reading path.*?\(([\d,]+) lines", text, re.S | re.I)
    assert total, "the reading path's total was not found"
    actual = sum(len((ROOT / path).read_text(encoding="utf-8").splitlines()) for path, _ in rows)
    assert abs(actual - int(total.group(1).replace(",", ""))) <= 0.1 * actual
