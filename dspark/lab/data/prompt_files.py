"""A user's prompts file: what `--prompts FILE` reads in `generate`, `bench offline`, `bench serve` and
`train responses`.

Two formats, told apart by the first non-blank line:

* JSON lines: one object per line with a string `prompt`, an optional `domain` (default "prompts") and an
  optional `split` ("train", "val", "eval": which part of a training set it is; a record without one counts
  as eval; `train responses` answers train and val, the benchmarks and `generate` read eval);
* plain text: one prompt per line (blank lines skipped), domain "prompts".

Lines end at "\n" (or "\r\n"): a form feed, U+0085, U+2028 or a lone "\r" inside a prompt is part of it, as in
JSON text. A file with a "\r" and no "\n" at all has old-Mac line ends, and its lines end at "\r" (text and JSON
lines alike: a JSON string cannot hold a raw "\r"). A UTF-8 byte-order mark at the start is dropped. A gzipped
file (`.gz`) reads like the file itself. Every problem is one line naming the file and the line (numbered from
1): a missing file, an empty one, bad JSON, a record without a text prompt.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from dspark.tokenizer import Tokenizer

DEFAULT_DOMAIN = "prompts"
SPLITS = ("train", "val", "eval")


@dataclass(frozen=True)
class PromptRecord:
    prompt: str
    domain: str = DEFAULT_DOMAIN
    split: str | None = None  # None: the file does not say
    line: int = 0  # where it stands in its file (from 1)


def _lines(path: Path) -> list[str]:
    """The file's lines, split at "\n" (a "\r" before it dropped), or at "\r" in a file without any "\n"
    (old-Mac line ends), without a leading byte-order mark."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (gzip.BadGzipFile, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError):
            raise
        raise ValueError(f"{path}: not a readable text file ({exc})") from None
    # old-Mac files end their lines at CR alone: nothing else in them is a line end
    end = b"\r" if b"\r" in raw and b"\n" not in raw else b"\n"
    try:
        text = raw.decode("utf-8-sig")  # -sig: a BOM some editors write is not part of the first line
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(end) + 1
        raise ValueError(f"{path} line {line}: not UTF-8 text (byte {raw[exc.start]:#04x})") from None
    if end == b"\r":
        return text.split("\r")
    return [line.removesuffix("\r") for line in text.split("\n")]


def _record(path: Path, number: int, line: str) -> PromptRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {number}: not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f'{path} line {number}: expected a JSON object with a "prompt"')
    prompt, domain, split = obj.get("prompt"), obj.get("domain", DEFAULT_DOMAIN), obj.get("split")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f'{path} line {number}: "prompt" must be a non-empty string')
    if not isinstance(domain, str) or not domain.strip():
        raise ValueError(f'{path} line {number}: "domain" must be a non-empty string')
    if split is not None and split not in SPLITS:
        raise ValueError(f'{path} line {number}: "split" must be one of {", ".join(SPLITS)}, got {split!r}')
    return PromptRecord(prompt, domain.strip(), split, number)


def read_prompts(path: str | Path, split: str | None = None) -> list[PromptRecord]:
    """The prompts of `path` in file order (only those of `split` when given: a record without a split counts
    as eval). FileNotFoundError for a missing file, ValueError (one line) for any other problem."""
    if not str(path).strip():  # Path("") would be the current folder
        raise ValueError("--prompts: empty path; give a prompts file")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} not found")
    if path.is_dir():
        raise ValueError(f"prompts file {path} is a folder")
    lines = _lines(path)
    numbered = [(i, line) for i, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise ValueError(f"prompts file {path} is empty")
    if numbered[0][1].lstrip().startswith("{"):
        records = [_record(path, i, line) for i, line in numbered]
    else:
        records = [PromptRecord(line.strip(), line=i) for i, line in numbered]
    return records if split is None else of_split(records, split, path)


def of_split(records: list[PromptRecord], split: str, path: str | Path) -> list[PromptRecord]:
    """The records of `split` (a record without one counts as eval); ValueError (one line) when none is."""
    kept = [r for r in records if (r.split or "eval") == split]
    if not kept:
        raise ValueError(f"prompts file {path} has no {split} prompts")
    return kept


def held_out(records: list[PromptRecord], path: str | Path) -> list[PromptRecord]:
    """What a benchmark measures on: the eval records (as `train instructions` splits a file; every record of a
    file without splits is eval). ValueError (one line) when that is none."""
    return of_split(records, "eval", path)


def prompt_ids_by_domain(
    path: str | Path, tokenizer: Tokenizer, context: int, per_domain: int | None = None, start: int = 0
) -> dict[str, list[list[int]]]:
    """Chat-prompt ids of a prompts file's held-out records per domain (numbers start .. start+per_domain-1 of
    each domain). ValueError (one line, naming the line) for a prompt that leaves no room to generate in
    `context` tokens."""
    records = held_out(read_prompts(path), path)
    out: dict[str, list[list[int]]] = {}
    seen: dict[str, int] = {}
    for r in records:
        rank = seen[r.domain] = seen.get(r.domain, -1) + 1
        if rank < start or (per_domain is not None and rank >= start + per_domain):
            continue
        ids = tokenizer.chat_prompt(r.prompt)
        if len(ids) >= context:
            raise ValueError(
                f"{path} line {r.line}: the prompt is {len(ids)} tokens with its chat template; the "
                f"target's context is {context} tokens and generation needs room for one more"
            )
        out.setdefault(r.domain, []).append(ids)
    if not out:
        raise ValueError(f"prompts file {path} has fewer than {start + 1} prompts per domain")
    return out
