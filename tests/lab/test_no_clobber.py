"""Outputs never destroy inputs (issue #59): every command that writes refuses, in one line and before any work, a
destination that is one of its own inputs or lies inside the dspark package. Each case names what the audit lost."""

import argparse
import json

import pytest

from dspark import bench, train
from dspark.checkpoint import ASSETS_DIR
from dspark.lab import cli
from dspark.lab.cli import run_main


def refused(main, argv, capsys) -> str:
    """The one stderr line of a command that must refuse with status 2."""
    assert run_main(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_train_drafter_refuses_its_responses_as_out(tmp_path, capsys):
    responses = (
        tmp_path / "responses.jsonl"
    )  # the audit lost this file: trained, then saved the checkpoint over it
    responses.write_text("".join(json.dumps({"domain": domain, "split": split, "prompt_ids": [5, 6, 7],
                                             "response_ids": [8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}) + "\n"
                                 for split in ("train", "val") for domain in ("chat", "code", "math")))  # fmt: skip
    before = responses.read_bytes()
    argv = [
        "drafter",
        "--kind",
        "mtp",
        "--live",
        "--steps",
        "1",
        "--responses",
        str(responses),
        "--out",
        str(responses),
    ]
    err = refused(train.main, argv, capsys)
    assert "--out" in err and "--responses" in err and "input" in err
    assert responses.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "responses.jsonl"
    ]


def test_bench_refuses_its_prompts_file_as_json(tmp_path, capsys):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("my own prompt\nanother one\n")
    argv = ["offline", "--drafters", "mtp", "--tau-only", "--temperatures", "0", "--max-new-tokens", "8"]
    err = refused(bench.main, [*argv, "--prompts", str(prompts), "--json", str(prompts)], capsys)
    assert "--json" in err and "--prompts" in err
    assert prompts.read_text() == "my own prompt\nanother one\n"


def test_a_link_to_an_input_is_that_input(tmp_path, capsys):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("my own prompt\n")
    (tmp_path / "link.json").symlink_to(prompts)
    refused(bench.main, ["offline", "--prompts", str(prompts), "--json", str(tmp_path / "link.json")], capsys)
    assert prompts.read_text() == "my own prompt\n"


@pytest.mark.parametrize(
    "argv",
    [["bench", "offline", "--json", "ASSETS/offline.json"], ["bench", "offline", "--out", "ASSETS"],
     ["train", "responses", "--out", "ASSETS/responses.jsonl"], ["train", "drafter", "--kind", "mtp", "--out",
     "ASSETS/drafter_mtp.safetensors"], ["train", "calibrate", "--out", "ASSETS/drafter_dspark.json"]],
)  # fmt: skip
def test_nothing_writes_into_the_package_but_ship(argv, capsys):
    before = {p: p.stat().st_mtime_ns for p in ASSETS_DIR.rglob("*")}
    main = {"bench": bench.main, "train": train.main}[argv[0]]
    err = refused(main, [a.replace("ASSETS", str(ASSETS_DIR)) for a in argv[1:]], capsys)
    assert "inside the dspark package" in err and "--ship" in err
    assert {p: p.stat().st_mtime_ns for p in ASSETS_DIR.rglob("*")} == before


def test_merging_with_an_earlier_result_is_not_destroying_it(tmp_path):
    """`bench depth --with F --json F` rewrites F with F's points kept (the protocol README's command)."""
    earlier = tmp_path / "depth.json"
    earlier.write_text(json.dumps({"rows": []}))
    args = argparse.Namespace(with_=None, json=str(earlier), out=str(tmp_path), points="dspark:2")
    setattr(args, "with", [str(earlier)])
    cli.refuse_clobber(args)  # no error
    args.prompts = str(earlier)  # the same file as a plain input is refused
    with pytest.raises(cli.UsageError, match="--prompts"):
        cli.refuse_clobber(args)


def test_a_folder_replaced_whole_may_not_hold_an_input(tmp_path):
    (tmp_path / "run").mkdir()
    checkpoint = tmp_path / "run" / "drafter.safetensors"
    checkpoint.write_bytes(b"weights")
    args = argparse.Namespace(out=str(tmp_path / "run"), drafter_checkpoint=str(checkpoint))
    cli.refuse_clobber(args)  # writing files into it is fine
    with pytest.raises(cli.UsageError, match="holds this command's input"):
        cli.refuse_clobber(args, replaced=("out",))
