"""Numbers and messages mean what they say (issue #59): acceptance by position counts committed tokens as τ does,
an unwritable cache costs the cache and not the answer, an option that does nothing is refused, and a file that is
not what a command resumes from is one line, not a traceback."""

import json

import pytest
import torch
from helpers import committed_drafts

from dspark import train
from dspark.checkpoint import TARGET_CHECKPOINT, TOKENIZER_PATH, load_target
from dspark.drafters import get_drafter
from dspark.engine import speculative_generate
from dspark.lab import profiles, storage
from dspark.lab.cli import run_main
from dspark.lab.commands import generate as generate_cmd
from dspark.sampling import SamplingParams
from dspark.tokenizer import Tokenizer


def test_generate_acceptance_by_position_agrees_with_tau_at_a_token_cut():
    """The shipped DSpark accepts all 7 drafts of the demo's math prompt (README): a cut at 10 tokens falls inside
    the second round's accepted drafts, which the old count still credited to positions 3..7."""
    target = load_target(TARGET_CHECKPOINT)[0]
    tokenizer = Tokenizer.load(TOKENIZER_PATH)
    drafter = get_drafter("dspark", target)
    prompt = tokenizer.chat_prompt(generate_cmd.demo_prompts("tiny")["math"])
    for limit in (3, 10, 17):
        result = speculative_generate(target, drafter, [prompt], limit, SamplingParams(0.0), 7,
                                      torch.Generator().manual_seed(0), tokenizer.eos_id)  # fmt: skip
        stats = result.stats
        assert sum(map(sum, stats.emitted)) + 1 == len(result.tokens[0]) == limit  # + the prefill's token
        assert sum(stats.acceptance_counts(7)[0]) == committed_drafts(stats), limit


def test_an_unwritable_cache_costs_the_cache_not_the_answer(tmp_path, monkeypatch, tiny_model, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DSPARK_HOME", str(blocker / "home"))
    monkeypatch.setattr(storage, "_unsaved", set(), raising=False)
    monkeypatch.setattr(
        profiles, "BUSY_SPREAD", float("inf")
    )  # (a busy machine would keep it unsaved anyway)
    first = profiles.cpu_profile(tiny_model)
    second = profiles.cpu_profile(tiny_model)  # measured again: nothing was saved
    assert first.steps_per_second and second.steps_per_second
    err = capsys.readouterr().err
    assert err.count("cannot save measurements") == 1 and "Not a directory" in err
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(
    "argv, says",
    [(["hi", "--threshold", "0.7"], "--policy threshold"),
     (["hi", "--policy", "dspark", "--threshold", "0.7"], "--policy dspark ignores it"),
     (["hi", "--policy", "fixed", "--ignore-draft-cost"], "--policy fixed never weighs"),
     (["hi", "--policy", "threshold", "--ignore-draft-cost"], "--policy threshold never weighs")],
)  # fmt: skip
def test_an_option_that_does_nothing_is_refused(argv, says, capsys):
    assert run_main(generate_cmd.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_train_responses_will_not_resume_a_file_that_is_not_responses(tmp_path, capsys):
    mine = tmp_path / "notes.jsonl"
    mine.write_text(json.dumps({"prompt": "my own data"}) + "\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "say hi", "split": "train"}) + "\n")
    argv = [
        "responses",
        "--prompts",
        str(prompts),
        "--out",
        str(mine),
        "--per-domain",
        "1",
        "--val-per-domain",
        "0",
    ]
    assert run_main(train.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert "notes.jsonl line 1 is not a response record" in err and "\n" not in err and "KeyError" not in err
    assert mine.read_text() == json.dumps({"prompt": "my own data"}) + "\n"
