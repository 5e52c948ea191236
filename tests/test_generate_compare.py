"""`generate --compare` says what speculation bought, and `--drafter prompt-lookup` runs from the command line."""

from __future__ import annotations

import json
import re

import pytest

from dspark.lab.cli import run_main
from dspark.lab.commands import generate

ARGS = ["Write a function that adds two numbers.", "--max-new-tokens", "12"]


def test_compare_prints_plain_and_speculative_speed_and_the_same_text(capsys):
    assert run_main(generate.main, [*ARGS, "--compare"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("plain decoding"))
    plain, spec, ratio = re.match(
        r"plain decoding ([\d.]+) tokens/s, dspark ([\d.]+) tokens/s \(([\d.]+)x\)", line
    ).groups()
    assert float(ratio) == pytest.approx(float(spec) / float(plain), rel=0.02, abs=0.01)
    assert "tau" in line and line.endswith("the same text")


def test_compare_in_json(capsys):
    assert run_main(generate.main, [*ARGS, "--compare", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["same_text_as_plain"] is True
    assert record["speedup"] == pytest.approx(record["tokens_per_s"] / record["plain_tokens_per_s"], rel=0.01)


def test_the_demo_compares_unless_told_not_to(capsys):
    assert run_main(generate.main, ["--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "plain decoding" in out and "--model smollm2-135m" in out  # the tiny target's note
    assert run_main(generate.main, ["--max-new-tokens", "6", "--no-compare"]) == 0
    assert "plain decoding" not in capsys.readouterr().out
    assert run_main(generate.main, [*ARGS]) == 0  # a prompt of the user's: only when asked
    assert "plain decoding" not in capsys.readouterr().out


def test_compare_needs_a_drafter(capsys):
    assert run_main(generate.main, [*ARGS, "--drafter", "none", "--compare"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--compare" in err and len(err.strip().splitlines()) == 1


def test_prompt_lookup_gives_plain_decodings_text(capsys):
    prompt = [
        "Repeat after me: one two three, one two three, one two three",
        "--max-new-tokens",
        "16",
        "--json",
    ]
    assert run_main(generate.main, [*prompt, "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    for policy in ("fixed", "threshold"):
        assert run_main(generate.main, [*prompt, "--drafter", "prompt-lookup", "--policy", policy]) == 0
        looked_up = json.loads(capsys.readouterr().out)
        assert looked_up["text"] == plain["text"] and looked_up["gamma"] == 8, policy


def test_prompt_lookup_has_no_checkpoint(tmp_path, capsys):
    argv = [*ARGS, "--drafter", "prompt-lookup", "--drafter-checkpoint", str(tmp_path / "x.safetensors")]
    assert run_main(generate.main, argv) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no weights" in err and "Traceback" not in err
