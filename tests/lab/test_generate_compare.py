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
    assert "plain decoding" in out and "without --model tiny, a real model" in out  # the tiny target's note
    assert "batch 1 each" in out and "target tiny, 5 M parameters, float32" in out  # one at a time, named
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


def test_without_model_generate_runs_smollm2_and_tiny_is_one_flag_away(monkeypatch):
    """The default target is SmolLM2 (the tests name the tiny one through DSPARK_MODEL, set in conftest);
    `--model tiny` and a --checkpoint of the shipped kind are the tiny target (None for `cli.load_target`)."""
    parse = generate.build_parser().parse_args
    monkeypatch.delenv("DSPARK_MODEL")
    for argv, model in ((["hi"], "smollm2-135m"), (["hi", "--model", "tiny"], None),
                        (["hi", "--checkpoint", "other.safetensors"], None),
                        (["hi", "--model", "smollm2-135m"], "smollm2-135m")):  # fmt: skip
        args = parse(argv)
        generate.resolve_model(args)
        assert args.model == model, argv
    monkeypatch.setenv("DSPARK_MODEL", "tiny")
    args = parse(["hi"])
    generate.resolve_model(args)
    assert args.model is None


def test_the_default_policy_is_the_papers_scheduler_where_the_drafter_has_confidences(capsys):
    """No --policy: Algorithm 1 (dspark) for a drafter with a confidence head, verify-all for one without; the
    demo's text is the same either way at T = 0 (tests/lab/test_demo_output.py pins it)."""
    assert run_main(generate.main, [*ARGS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "dspark"
    assert run_main(generate.main, [*ARGS, "--json", "--drafter", "mtp"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "fixed"


def test_a_run_that_hardly_drafted_says_drafting_did_not_pay():
    """`drafted_share`: the share of request-rounds that drafted ([] confidences: a plain step)."""
    from dspark.requests import RoundRecord, RoundStats

    plain, drafted = RoundRecord(0, 0, 1, []), RoundRecord(2, 1, 2, [0.9, 0.5])
    assert generate.drafted_share(RoundStats([[plain] * 9 + [drafted]])) == pytest.approx(0.1)
    assert generate.drafted_share(RoundStats([[RoundRecord(1, 1, 2, None)]])) == 1.0  # no head: it drafted
