"""Prompts files are read as their format says (issue #59): a byte-order mark is dropped, lines end at "\\n" (or at
"\\r" in an old-Mac file with no "\\n", issue #69), a record without a split counts as eval, and a file that
cannot be read is one line naming the line."""

import json

import pytest

from dspark.lab.cli import prompts_source
from dspark.lab.data.prompt_files import held_out, read_prompts


def test_a_byte_order_mark_is_dropped_and_json_lines_stay_json(tmp_path):
    rows = [{"prompt": "sum a list", "domain": "code"}, {"prompt": "what is 2 + 3?", "domain": "math"}]
    path = tmp_path / "bom.jsonl"
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8-sig"
    )  # writes EF BB BF first
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    assert [(r.prompt, r.domain) for r in read_prompts(path)] == [
        ("sum a list", "code"),
        ("what is 2 + 3?", "math"),
    ]
    text = tmp_path / "bom.txt"
    text.write_text("first\nsecond\n", encoding="utf-8-sig")
    assert [r.prompt for r in read_prompts(text)] == ["first", "second"]


@pytest.mark.parametrize("inside", ["\x0c", "\x85", "\u2028", "\u2029", "\x1c", "\r"])
def test_lines_end_at_newline_only(tmp_path, inside):
    text = tmp_path / "p.txt"
    text.write_text(f"one{inside}prompt\r\nanother\n", encoding="utf-8", newline="")
    assert [(r.prompt, r.line) for r in read_prompts(text)] == [
        (f"one{inside}prompt".strip(), 1),
        ("another", 2),
    ]
    jsonl = tmp_path / "p.jsonl"  # json.dumps(ensure_ascii=False) leaves U+2028 raw: valid JSON text
    jsonl.write_text(
        json.dumps({"prompt": f"a{inside}b"}, ensure_ascii=False) + "\n", encoding="utf-8", newline=""
    )
    assert [r.prompt for r in read_prompts(jsonl)] == [f"a{inside}b"]


def test_a_record_without_a_split_counts_as_eval(tmp_path):
    path = tmp_path / "split.jsonl"
    rows = [
        {"prompt": "train me", "split": "train"},
        {"prompt": "no split"},
        {"prompt": "eval me", "split": "eval"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r.prompt for r in held_out(read_prompts(path), path)] == ["no split", "eval me"]
    assert [r.prompt for r in read_prompts(path, "eval")] == ["no split", "eval me"]


def test_bytes_that_are_not_utf8_name_their_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("fine\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt line 2: not UTF-8 text") as caught:
        read_prompts(path)
    assert "\n" not in str(caught.value)


def test_an_empty_prompts_path_is_named_empty_not_a_folder():
    with pytest.raises(ValueError, match="empty path"):
        read_prompts("")
    with pytest.raises(Exception, match="empty path"):
        prompts_source("")


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"])
def test_old_mac_cr_line_ends_split_like_the_others(tmp_path, end):
    """A file saved with CR-only line ends (classic Mac OS) is one prompt per line, as LF and CRLF files are."""
    text = tmp_path / "p.txt"
    text.write_text(end.join(["first", "second", "", "third"]) + end, encoding="utf-8", newline="")
    assert [(r.prompt, r.line) for r in read_prompts(text)] == [("first", 1), ("second", 2), ("third", 4)]
    rows = [{"prompt": "sum a list", "domain": "code"}, {"prompt": "what is 2 + 3?", "domain": "math"}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(end.join(json.dumps(r) for r in rows) + end, encoding="utf-8-sig", newline="")
    assert [(r.prompt, r.domain, r.line) for r in read_prompts(jsonl)] == [
        ("sum a list", "code", 1),
        ("what is 2 + 3?", "math", 2),
    ]


def test_bytes_that_are_not_utf8_name_their_line_in_a_cr_only_file(tmp_path):
    path = tmp_path / "mac.txt"
    path.write_bytes("fine\rstill fine\rcaf\xe9\r".encode("latin-1"))
    with pytest.raises(ValueError, match=r"mac.txt line 3: not UTF-8 text"):
        read_prompts(path)
