"""Command lines: --help everywhere, one JSON object, clear errors without tracebacks."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark import bench, generate, train
from dspark.checkpoint import TARGET_CHECKPOINT
from dspark.lab import cli
from dspark.lab.cli import run_main
from dspark.lab.commands import bench as bench_command
from dspark.lab.commands import generate as generate_command
from dspark.lab.commands import train as train_command
from dspark.lab.cost_aware.draft_cost import draft_cost_of, measured_profile_file
from dspark.lab.data.corpus import EVAL_PER_DOMAIN
from dspark.lab.machine import cpu_description

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "module, argv",
    [
        (generate, []),
        (train, []),
        (train, ["data"]),
        (train, ["target"]),
        (train, ["responses"]),
        (train, ["drafter"]),
        (bench, []),
        (bench, ["ar"]),
        (bench, ["offline"]),
        (bench, ["ratios"]),
        (bench, ["depth"]),
        (bench, ["gamma"]),
        (bench, ["threshold"]),
        (bench, ["calibration"]),
        (bench, ["appendix-a"]),
        (bench, ["profile"]),
        (bench, ["serve"]),
        (bench, ["simulate"]),
        (bench, ["kernels"]),
        (bench, ["gpu"]),
        (train, ["calibrate"]),
    ],  # fmt: skip
)
def test_help(module, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: python -m dspark." in capsys.readouterr().out


SHARED_OPTIONS = {"--threads", "--checkpoint", "--gamma", "--temperature", "--max-new-tokens", "--drafter",
                  "--drafter-checkpoint", "--json", "--out", "--seed", "--ignore-draft-cost", "--device"}  # fmt: skip


def test_shared_options_are_declared_only_in_cli():
    """generate, train and bench (and the study modules they call) take these options from dspark/lab/cli.py's
    helpers instead of declaring them again: no option string of SHARED_OPTIONS in any call there
    (add_argument, add_option, ...)."""
    commands = ROOT / "dspark" / "lab" / "commands"
    sources = [ROOT / "dspark" / "generate.py", commands / "train.py", commands / "bench.py"]
    found = []
    for path in sources + sorted((ROOT / "dspark" / "lab" / "study").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in SHARED_OPTIONS:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {arg.value}")
    assert not found, "declare these with the helpers in dspark/lab/cli.py:\n" + "\n".join(found)
    # the kernel benchmark is `python -m dspark.bench kernels`; its study module only measures
    assert "argparse" not in (ROOT / "dspark" / "lab" / "study" / "kernels.py").read_text()


def parsers_with_subcommands(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from parsers_with_subcommands(subparser, f"{name} {sub}")


def test_threads_has_one_default_everywhere():
    """0 = torch's default (one thread per physical core) in generate and every train / bench subcommand."""
    defaults = {}
    parsers = {
        "dspark.generate": generate_command,
        "dspark.train": train_command,
        "dspark.bench": bench_command,
    }
    for command, module in parsers.items():
        for name, parser in parsers_with_subcommands(module.build_parser(), command):
            for action in parser._actions:
                if "--threads" in action.option_strings:
                    defaults[name] = action.default
    some = {
        "dspark.generate",
        "dspark.train target",
        "dspark.train drafter",
        "dspark.bench ar",
        "dspark.bench kernels",
    }
    assert some <= set(defaults)
    assert set(defaults.values()) == {0}, defaults


def test_generate_json_one_prompt(small_checkpoint, capsys):
    code = run_main(
        generate.main,
        [
            "Hello there",
            "--max-new-tokens",
            "5",
            "--json",
            "--checkpoint",
            str(small_checkpoint),
            "--drafter",
            "none",
        ],
    )
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads(out)  # exactly one JSON object on stdout
    assert isinstance(record["text"], str) and record["new_tokens"] <= 5 and record["tokens_per_s"] > 0


def test_generate_demo_json_has_one_entry_per_domain(small_checkpoint, capsys):
    code = run_main(generate.main, ["--max-new-tokens", "3", "--json", "--temperature", "0.8",
                                    "--top-k", "50", "--top-p", "0.9", "--checkpoint", str(small_checkpoint), "--drafter", "none"])  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and len(record["text"]) == 3 and len(record["new_tokens"]) == 3


def test_generate_same_seed_same_text(small_checkpoint, capsys):
    args = [
        "Say something",
        "--max-new-tokens",
        "8",
        "--temperature",
        "1",
        "--json",
        "--checkpoint",
        str(small_checkpoint),
        "--drafter",
        "none",
    ]
    texts = []
    for seed in ("3", "3", "4"):
        run_main(generate.main, [*args, "--seed", seed])
        texts.append(json.loads(capsys.readouterr().out)["text"])
    assert texts[0] == texts[1]


@pytest.mark.parametrize("kind", ["mtp", "eagle", "dspark"])
def test_generate_with_a_drafter(small_checkpoint, small_drafters, kind, capsys):
    base = ["Hello there", "--max-new-tokens", "12", "--checkpoint", str(small_checkpoint)]
    assert run_main(generate.main, [*base, "--json", "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    gamma = "1" if kind == "mtp" else "3"  # MTP-1 drafts one token; asking it for more is an error
    spec_args = [
        *base,
        "--drafter",
        kind,
        "--drafter-checkpoint",
        str(small_drafters[kind]),
        "--gamma",
        gamma,
    ]
    assert run_main(generate.main, [*spec_args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"] == plain["text"]  # greedy: the drafter never changes the output
    assert record["drafter"] == kind and record["rounds"] >= 1 and record["tau"] >= 1
    assert len(record["acceptance_by_position"]) == (1 if kind == "mtp" else 3)
    assert run_main(generate.main, spec_args) == 0
    assert "acceptance by position" in capsys.readouterr().out


def test_eagle_gamma_out_of_range(small_checkpoint, small_drafters, capsys):
    argv = ["hi", "--checkpoint", str(small_checkpoint), "--drafter", "eagle",
            "--drafter-checkpoint", str(small_drafters["eagle"]), "--gamma", "9"]  # fmt: skip
    assert run_main(generate.main, argv) == 2
    assert "--gamma" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["   "], "prompt is empty"),
        (["word " * 400], "context"),
        (["hi", "--temperature", "-1"], "temperature"),
        (["hi", "--top-p", "0"], "top-p"),
        (["hi", "--max-new-tokens", "0"], "max-new-tokens"),
        (["hi", "--checkpoint", "/nonexistent/model.safetensors"], "not found"),
        (
            ["hi", "--drafter", "eagle", "--drafter-checkpoint", "/nonexistent/d.safetensors"],
            "no trained eagle",
        ),
    ],
)
def test_generate_errors_are_clear(small_checkpoint, argv, message, capsys):
    if "--checkpoint" not in argv:
        argv = [*argv, "--checkpoint", str(small_checkpoint)]
    if "--drafter" not in argv:
        argv = [*argv, "--drafter", "none"]
    assert run_main(generate.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value", [
    ("--temperature", "-0.1"), ("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "1e-39"),
    ("--temperature", "1e-7"), ("--top-k", "-1"), ("--top-p", "0"), ("--top-p", "1.5"), ("--top-p", "nan"),
])  # fmt: skip
def test_unusable_sampling_settings_are_refused_when_parsed(flag, value, capsys):
    """The parser refuses what `SamplingParams` cannot use (the core does not check): a temperature other than
    0 or a finite number >= 1e-6 (smaller ones overflow fp32 logits / T), a negative top-k, a top-p outside
    (0, 1]; `--temperatures` lists alike."""
    parser = argparse.ArgumentParser()
    cli.add_sampling(parser, temperature=1.0, top=True)
    with pytest.raises(SystemExit):
        parser.parse_args([flag, value])
    assert flag in capsys.readouterr().err
    if flag == "--temperature":
        with pytest.raises(argparse.ArgumentTypeError, match="temperature|finite|>= 0"):
            cli.parse_temperature_list(f"1,{value}")


def test_usable_sampling_settings_pass():
    parser = argparse.ArgumentParser()
    cli.add_sampling(parser, temperature=1.0, top=True)
    for t in ("0", "1e-6", "0.7", "1", "1e6"):
        assert parser.parse_args(["--temperature", t]).temperature == float(t)
    args = parser.parse_args(["--top-k", "0", "--top-p", "1e-6"])
    assert (args.top_k, args.top_p) == (0, 1e-6)
    assert cli.parse_temperature_list("0,1e-6,0.7") == [0.0, 1e-6, 0.7]


def test_corrupt_checkpoint_is_a_clear_error(small_checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(small_checkpoint.read_bytes()[:100])
    bad.with_suffix(".json").write_text(small_checkpoint.with_suffix(".json").read_text())
    assert run_main(generate.main, ["hi", "--checkpoint", str(bad)]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_default_drafter_on_another_target_says_what_to_do(small_checkpoint, capsys):
    assert run_main(generate.main, ["hi", "--checkpoint", str(small_checkpoint)]) == 2
    assert "--drafter none" in capsys.readouterr().err


def test_train_target_without_corpus_is_a_clear_error(tmp_path, capsys):
    assert run_main(train.main, ["target", "--data", str(tmp_path), "--out", str(tmp_path / "run")]) == 2
    assert "python -m dspark.train data" in capsys.readouterr().err


def test_bench_ar_runs(small_checkpoint, tmp_path, capsys):
    out = tmp_path / "ar.json"
    argv = ["ar", "--batch-sizes", "1,3", "--max-new-tokens", "4", "--repeats", "1",
            "--checkpoint", str(small_checkpoint), "--json", str(out)]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    assert "| batch |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in rows] == [1, 3] and all(r["tokens_per_s"] > 0 for r in rows)


def test_bench_study_commands_write_tables_and_figures(small_checkpoint, small_drafters, tmp_path, capsys):
    """threshold, gamma, depth and budget on a random small model: tables, PNGs, JSON."""
    drafter = f"d={small_drafters['dspark']}"
    common = ["--prompts-per-domain", "2", "--max-new-tokens", "6", "--checkpoint", str(small_checkpoint),
              "--out", str(tmp_path)]  # fmt: skip
    assert run_main(bench.main, ["threshold", "--drafter", drafter, "--thresholds", "0,0.5", *common]) == 0
    assert "acceptance rate" in capsys.readouterr().out
    argv = ["gamma", "--drafters", drafter, "--gammas", "1,3", "--latency-batch", "2", "--repeats", "1",
            *common, "--json", str(tmp_path / "g.json")]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    record = json.loads((tmp_path / "g.json").read_text())
    assert {r["gamma"] for r in record["tau"]} == {1, 3} and len(record["latency"]) == 2
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    for suffix in (".safetensors", ".json"):
        (study_dir / f"dspark_L1{suffix}").write_bytes(
            small_drafters["dspark"].with_suffix(suffix).read_bytes()
        )
    meta_file = study_dir / "dspark_L1.json"  # what `train drafter` records: validation c* per position
    meta_file.write_text(
        json.dumps(json.loads(meta_file.read_text()) | {"meta": {"val_expected_acceptance": [0.5, 0.4, 0.3]}})
    )
    argv = [
        "depth",
        "--kinds",
        "dspark",
        "--layers",
        "1",
        "--gamma",
        "3",
        "--study-dir",
        str(study_dir),
        *common,
    ]
    assert run_main(bench.main, [*argv, "--draft-batches", "1,2", "--json", str(tmp_path / "d.json")]) == 0
    printed = capsys.readouterr().out
    assert "| dspark | 1 |" in printed and "draft ms (batch 2)" in printed and "| 0.400 |" in printed
    (summary,) = [
        r for r in json.loads((tmp_path / "d.json").read_text())["results"] if r["domain"] == "macro"
    ]
    assert summary["val_c_star"] == [0.5, 0.4, 0.3] and summary["megabytes"] > 0
    assert set(summary["draft_ms"]) == {"1", "2"} and all(ms > 0 for ms in summary["draft_ms"].values())
    # --with: the points of an earlier session's JSON join the table (a point measured now is not repeated),
    # each with the machine that timed it; a file of other prompts or temperature is refused
    earlier = json.loads((tmp_path / "d.json").read_text())
    # (its rows name no machine, as an older file's: the file's own machine timed them)
    moved = [
        {k: v for k, v in r.items() if k != "machine"} | {"kind": "dflash", "layers": 5}
        for r in earlier["results"]
    ]
    earlier |= {"machine": "Another CPU", "results": earlier["results"] + moved}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    assert run_main(bench.main, [*argv, "--draft-batches", "1,2", "--with", str(tmp_path / "earlier.json"),
                                 "--json", str(tmp_path / "d2.json")]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "timed on" in printed and "| dflash | 5 |" in printed and "Another CPU |" in printed
    merged = [r for r in json.loads((tmp_path / "d2.json").read_text())["results"] if r["domain"] == "macro"]
    assert [(r["kind"], r["layers"]) for r in merged] == [("dspark", 1), ("dflash", 5)]
    assert merged[0]["machine"] != "Another CPU" and merged[1]["draft_ms"] == summary["draft_ms"]
    # a merged file merged again: each point keeps the machine that timed it, not the file's own
    assert run_main(bench.main, [*argv, "--draft-batches", "1,2", "--with", str(tmp_path / "d2.json"),
                                 "--json", str(tmp_path / "d3.json")]) == 0  # fmt: skip
    assert "Another CPU |" in capsys.readouterr().out
    again = [r for r in json.loads((tmp_path / "d3.json").read_text())["results"] if r["domain"] == "macro"]
    assert [r["machine"] for r in again] == [r["machine"] for r in merged]
    (tmp_path / "hot.json").write_text(json.dumps(earlier | {"temperature": 0.5}))
    assert run_main(bench.main, [*argv, "--with", str(tmp_path / "hot.json")]) == 2
    assert "temperature 0.5" in capsys.readouterr().err
    # --points names the pairs itself; a malformed one is a usage error
    points = [a for a in argv if a not in ("--kinds", "dspark", "--layers", "1")]
    assert run_main(bench.main, [*points, "--points", "dspark:1", "--draft-batches", "1"]) == 0
    capsys.readouterr()
    assert run_main(bench.main, [*points, "--points", "dspark"]) == 2
    assert "KIND:LAYERS" in capsys.readouterr().err
    for name in ("threshold", "gamma", "depth"):
        assert (tmp_path / f"{name}.md").is_file() and (tmp_path / f"{name}.png").stat().st_size > 1000
    # a missing study checkpoint says how to train it
    assert run_main(bench.main, [*argv[:-2], "--layers", "2"]) == 2
    assert "python -m dspark.train drafter --kind dspark --layers 2" in capsys.readouterr().err
    # budget: a run's --keep-at snapshot and its end, each with the epochs its JSON records
    record = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps(record | {"meta": record["meta"] | {"epochs": 1.0}}))
    (study_dir / "dspark_L1.epochs-0.5.safetensors").write_bytes(
        (study_dir / "dspark_L1.safetensors").read_bytes()
    )
    (study_dir / "dspark_L1.epochs-0.5.json").write_text(json.dumps(record | {"meta": {"epochs": 0.5}}))
    budget = ["budget", "--points", "dspark:1", "--gamma", "3", "--study-dir", str(study_dir), *common]
    assert run_main(bench.main, [*budget, "--marks", "0.5", "--json", str(tmp_path / "b.json")]) == 0
    printed = capsys.readouterr().out
    assert "| dspark | 1 | 0.50 |" in printed and "| dspark | 1 | 1.00 |" in printed
    macro_rows = [
        r for r in json.loads((tmp_path / "b.json").read_text())["results"] if r["domain"] == "macro"
    ]
    assert [r["epochs"] for r in macro_rows] == [0.5, 1.0]
    assert (tmp_path / "budget.md").is_file() and (tmp_path / "budget.png").stat().st_size > 1000
    assert run_main(bench.main, [*budget, "--marks", "0.5,2"]) == 2  # a snapshot the run did not keep
    assert "--keep-at 0.5 2" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["dspark", "none"])
def test_bench_offline_runs_generates_policy(
    small_checkpoint, small_drafters, policy, tmp_path, monkeypatch, capsys
):
    """bench offline --policy builds generate's scheduler for each drafter (fixed for one without
    confidences under a confidence policy), and at T = 0 counts the prompts that kept plain decoding's text."""
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))  # the measured SPS profile is cached there
    out = tmp_path / "o.json"
    argv = ["offline", "--drafters", f"d={small_drafters['dspark']},e={small_drafters['eagle']}", "--gamma", "3",
            "--policy", policy, "--temperatures", "0", "--prompts-per-domain", "2", "--max-new-tokens", "6",
            "--checkpoint", str(small_checkpoint), "--json", str(out)]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    assert "| text = plain |" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["policy"] == {"d": policy, "e": "fixed" if policy == "dspark" else policy}
    rows = [r for r in record["results"] if r["drafter"] != "none"]
    assert len(rows) == 6 and all(r["same_as_plain"] == "2/2" for r in rows)  # fp32 greedy: exact
    verified = {r["drafter"]: r["mean_verify_len"] for r in rows}
    if policy == "none":  # the scheduler really decides: nothing is verified
        assert verified == {"d": 0.0, "e": 0.0}
    else:
        assert 0 <= verified["d"] <= 3 and verified["e"] == 3.0


def test_calibrate_then_bench_calibration(small_checkpoint, small_drafters, tmp_path, capsys):
    drafter = tmp_path / "d.safetensors"
    for suffix in (".safetensors", ".json"):
        drafter.with_suffix(suffix).write_bytes(small_drafters["dspark"].with_suffix(suffix).read_bytes())
    common = ["--drafter", "dspark", "--drafter-checkpoint", str(drafter), "--checkpoint", str(small_checkpoint),
              "--gamma", "3", "--max-new-tokens", "4"]  # fmt: skip
    argv = ["calibration", *common, "--prompts-per-domain", "2"]
    assert run_main(bench.main, argv) == 2  # not calibrated yet: says what to run
    assert "python -m dspark.train calibrate" in capsys.readouterr().err
    assert run_main(train.main, ["calibrate", *common]) == 0
    assert "stored the STS temperatures" in capsys.readouterr().out
    out = tmp_path / "cal.json"
    assert run_main(bench.main, [*argv, "--json", str(out), "--out", str(tmp_path)]) == 0
    positions = json.loads(out.read_text())["positions"]
    assert [p["k"] for p in positions] == [1, 2, 3]
    assert {"ece_before", "ece_after", "auroc", "brier"} <= set(positions[0])
    assert (tmp_path / "reliability.png").is_file()


@pytest.mark.parametrize("policy", ["dspark", "dspark-async", "threshold", "goodput", "mtp1", "none"])
def test_generate_with_a_policy(small_checkpoint, small_drafters, policy, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))  # the measured SPS profile is cached there
    base = ["Hello there", "--max-new-tokens", "12", "--checkpoint", str(small_checkpoint), "--json"]
    assert run_main(generate.main, [*base, "--drafter", "none"]) == 0
    plain = json.loads(capsys.readouterr().out)
    argv = [*base, "--drafter", "dspark", "--drafter-checkpoint", str(small_drafters["dspark"]), "--gamma", "3",
            "--policy", policy]  # fmt: skip
    assert run_main(generate.main, argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"] == plain["text"] and record["policy"] == policy
    assert 0 <= record["mean_verify_len"] <= 3
    if policy == "none":
        assert record["mean_verify_len"] == 0
    assert list(tmp_path.glob("profiles/cpu-*.json"))
    eagle = ["hi", "--checkpoint", str(small_checkpoint), "--drafter", "eagle", "--drafter-checkpoint",
             str(small_drafters["eagle"]), "--gamma", "3", "--policy", "dspark"]  # fmt: skip
    assert run_main(generate.main, eagle) == 2 and "confidence head" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [[], ["--poisson", "50"]])
def test_bench_serve_plain_policy(small_checkpoint, tmp_path, monkeypatch, mode, capsys):
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    out = tmp_path / "serve.json"
    argv = ["serve", "--policy", "none", "--concurrency", "1,2", "--requests", "3", "--max-new-tokens", "4",
            "--checkpoint", str(small_checkpoint), "--out", str(tmp_path), "--json", str(out), *mode]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    points = json.loads(out.read_text())["points"]
    assert [p["concurrency"] for p in points] == [1, 2]
    keys = {
        "policy",
        "drafter",
        "concurrency",
        "throughput",
        "tps_per_user",
        "tpot_ms",
        "mean_verify_len",
        "tau",
        "completed",
        "rejected",
    }
    assert all(keys <= set(p) and p["throughput"] > 0 and p["completed"] == 3 for p in points)
    assert (tmp_path / "serve_frontier.png").is_file()
    assert (
        run_main(bench.main, [*argv[:-4], "--repeats", "2", "--json", str(out)]) == 0
    )  # medians of 2 sweeps
    points = json.loads(out.read_text())["points"]
    assert [(p["concurrency"], p["repeats"]) for p in points] == [(1, 2), (2, 2)]
    assert "medians of 2 interleaved repeats" in capsys.readouterr().out
    assert run_main(bench.main, ["serve", "--policy", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err


def test_bench_appendix_a_json(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert run_main(bench.main, ["appendix-a", "--draws", "3000", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record) == {"target", "retrospective", "early_stop", "async", "draws"}
    assert record["retrospective"][0] > 0.8 and abs(record["early_stop"][0] - 0.7) < 0.05


@pytest.mark.skipif(not TARGET_CHECKPOINT.is_file(), reason="no shipped target checkpoint yet")
def test_readme_command_on_the_shipped_model():
    """What the README's first command runs, as a real subprocess (fresh interpreter): the demo on SmolLM2
    (fetched by `.ci/run`), the paper's scheduler, compared with plain decoding -- the same text."""
    env = {k: v for k, v in os.environ.items() if k != "DSPARK_MODEL"} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "dspark.generate", "--max-new-tokens", "8", "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert len(record["text"]) == 3 and all(n > 0 for n in record["new_tokens"])
    assert record["policy"] == "dspark" and record["same_text_as_plain"] is True
    assert record["prompts"][0] == generate_command.EVERYDAY_DEMO["code"]  # a real model's demo
    bad = subprocess.run([sys.executable, "-m", "dspark.generate", "", "--json"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)  # fmt: skip
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and bad.stdout == ""


def test_generate_on_the_triton_kernels_gives_the_same_text(small_checkpoint, small_drafters, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    pytest.importorskip("triton")
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))  # the measured SPS profile is cached there
    argv = ["Hello there", "--max-new-tokens", "10", "--checkpoint", str(small_checkpoint), "--json", "--drafter",
            "dspark", "--drafter-checkpoint", str(small_drafters["dspark"]), "--gamma", "3", "--policy", "dspark",
            "--temperature", "1", "--seed", "3"]  # fmt: skip
    texts = {}
    for mode in ("reference", "triton"):
        assert run_main(generate.main, [*argv, "--kernels", mode]) == 0
        record = json.loads(capsys.readouterr().out)
        assert record["kernels"] == mode
        texts[mode] = record["text"]
    assert texts["triton"] == texts["reference"]  # same uniforms, same tokens
    from dspark_kernels import kernel_mode

    assert kernel_mode() == "auto"  # the CLI's choice does not leak


def test_bench_profile_measures_what_the_cost_aware_policy_reads(
    small_checkpoint, small_drafters, tmp_path, monkeypatch, capsys
):
    """`bench profile --drafters` fills both caches `generate --policy dspark` reads: generating afterwards
    measures nothing new (no new file under DSPARK_HOME/profiles)."""
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    drafter = f"dspark={small_drafters['dspark']}"
    argv = ["profile", "--checkpoint", str(small_checkpoint), "--drafters", drafter, "--device", "cpu",
            "--json", str(tmp_path / "profile.json")]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    assert "drafting cost of dspark (γ = 3)" in capsys.readouterr().out
    measured = sorted(p.name for p in (tmp_path / "profiles").iterdir())
    # the JSON gives back what the policy reads (the notebooks replay it): the same profile and drafting cost
    profile, costs, machine = measured_profile_file(tmp_path / "profile.json")
    cached = [json.loads(p.read_text()) for p in (tmp_path / "profiles").iterdir()]
    assert [profile.steps_per_second] == [r["steps_per_second"] for r in cached if "steps_per_second" in r]
    assert costs["dspark"] in [draft_cost_of(r) for r in cached if "seconds_by_requests" in r]
    assert machine == cpu_description()
    assert any(n.startswith("cpu-") for n in measured) and any(n.startswith("draft-") for n in measured)
    argv = ["hi", "--max-new-tokens", "4", "--checkpoint", str(small_checkpoint), "--drafter", "dspark",
            "--drafter-checkpoint", str(small_drafters["dspark"]), "--policy", "dspark", "--device", "cpu"]  # fmt: skip
    assert run_main(generate.main, argv) == 0
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == measured


def test_bench_offline_tau_only_measures_what_the_timed_run_does(
    small_checkpoint, small_drafters, tmp_path, capsys
):
    """--tau-only (no clock, no plain decoding) gives the timed run's τ and per-prompt counts: at T = 0 and
    batch 1 the two decode the same tokens; both print the paired macro-τ ratio with its interval."""
    common = ["offline", "--drafters", f"d={small_drafters['dspark']},e={small_drafters['eagle']}", "--gamma", "3",
              "--temperatures", "0", "--prompts-per-domain", "2", "--max-new-tokens", "6",
              "--checkpoint", str(small_checkpoint)]  # fmt: skip
    records = []
    for extra in (["--policy", "fixed"], ["--tau-only", "--batch-size", "1"]):  # both verify every draft
        out = tmp_path / f"o{len(extra)}.json"
        assert run_main(bench.main, [*common, *extra, "--json", str(out)]) == 0
        assert "| 0 | d / e |" in capsys.readouterr().out
        records.append(json.loads(out.read_text()))
    timed, untimed = ([r for r in rec["results"] if r["drafter"] != "none"] for rec in records)
    assert [r["tokens_per_s"] for r in untimed] == [None] * 6 and all(r["tokens_per_s"] > 0 for r in timed)
    keys = ("drafter", "domain", "tau", "prompt_tokens", "prompt_rounds", "cond_acceptance")
    assert [{k: r[k] for k in keys} for r in untimed] == [{k: r[k] for k in keys} for r in timed]
    (ratio,) = records[1]["macro_tau_ratios"]
    assert (ratio["a"], ratio["b"]) == ("d", "e") and ratio["low"] <= ratio["ratio"] <= ratio["high"]
    # what it measured, where
    assert records[0]["prompts"] == "shipped held-out" and records[0]["prompts_per_domain"] == 2
    assert records[0]["max_new_tokens"] == 6 and records[0]["machine"]
    # `bench ratios` pairs the two runs' JSON over prompts: at T = 0 each drafter's τ is the same in both
    both = [str(tmp_path / "o2.json"), str(tmp_path / "o3.json")]
    assert (
        run_main(bench.main, ["ratios", *both, "--drafters", "d,d@2,e", "--json", str(tmp_path / "r.json")])
        == 0
    )
    ratios = {(r["a"], r["b"]): r for r in json.loads((tmp_path / "r.json").read_text())["macro_tau_ratios"]}
    assert set(ratios) == {("d", "d@2"), ("d", "e"), ("d@2", "e")} and ratios["d", "d@2"]["ratio"] == 1.0
    assert ratios["d", "e"]["ratio"] == ratios["d@2", "e"]["ratio"] == ratio["ratio"]
    assert run_main(bench.main, ["ratios", both[0], str(tmp_path / "missing.json")]) == 2
    assert "missing.json: not a readable JSON file" in capsys.readouterr().err
    # the scheduler's policies need the timed path
    assert run_main(bench.main, [*common, "--tau-only", "--policy", "dspark"]) == 2
    assert "--policy fixed" in capsys.readouterr().err


def test_bench_offline_reads_more_prompts_of_a_file_than_the_shipped_set_holds(
    small_checkpoint, small_drafters, tmp_path, capsys
):
    """--prompts-per-domain is capped at the shipped held-out set's 80 per domain, but a prompts file is measured
    up to its own count (HumanEval: 164); asking a file for more than it holds measures what it has, and says so;
    its one domain draws as a one-panel figure."""
    prompts = tmp_path / "many.txt"
    prompts.write_text("".join(f"say {i}\n" for i in range(EVAL_PER_DOMAIN + 3)))
    out = tmp_path / "o.json"
    argv = ["offline", "--drafters", f"d={small_drafters['dspark']}", "--gamma", "2", "--temperatures", "0",
            "--tau-only", "--batch-size", "64", "--max-new-tokens", "2", "--checkpoint", str(small_checkpoint),
            "--prompts", str(prompts), "--json", str(out)]  # fmt: skip
    figures = tmp_path / "figures"  # one domain: a figure of one panel
    assert (
        run_main(
            bench.main, [*argv, "--prompts-per-domain", str(EVAL_PER_DOMAIN + 10), "--out", str(figures)]
        )
        == 0
    )
    assert (figures / "position_acceptance_T0.png").stat().st_size > 0
    assert f"per domain: prompts {EVAL_PER_DOMAIN + 3}," in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["prompts_measured"] == {"prompts": EVAL_PER_DOMAIN + 3}
    assert [len(r["prompt_tokens"]) for r in record["results"]] == [EVAL_PER_DOMAIN + 3]
    # without a file, the shipped set's cap
    assert run_main(bench.main, argv[:-4] + ["--prompts-per-domain", str(EVAL_PER_DOMAIN + 1)]) == 2
    assert f"must be 1..{EVAL_PER_DOMAIN}" in capsys.readouterr().err


def test_bench_training_times_the_drafter_train_drafter_builds(small_checkpoint, tmp_path, capsys):
    """bench training at a chosen depth, rank and draft vocabulary: its rows say which, the table prints them, and
    the JSON names the target and the machine."""
    g = torch.Generator().manual_seed(0)
    lines = [json.dumps({"domain": domain, "split": split, "prompt_ids": torch.randint(0, 100, (4,), generator=g).tolist(),
                         "response_ids": torch.randint(0, 100, (20,), generator=g).tolist()})
             for split in ("train", "train", "val") for domain in ("code", "math", "chat")]  # fmt: skip
    responses = tmp_path / "responses.jsonl"
    responses.write_text("\n".join(lines) + "\n")
    out = tmp_path / "t.json"
    argv = ["training", "--drafters", "dspark", "--settings", "cache:4:fp32", "--steps", "1", "--batch-size", "2",
            "--layers", "2", "--rank", "8", "--draft-vocab", "64", "--responses", str(responses), "--features-dir",
            str(tmp_path / "features"), "--checkpoint", str(small_checkpoint), "--json", str(out)]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    assert "layers 2, rank 8" in capsys.readouterr().out
    record = json.loads(out.read_text())
    (row,) = record["rows"]
    assert (row["drafter"], row["layers"], row["rank"]) == ("dspark", 2, 8) and row["anchors_per_s"] > 0
    assert record["target"] == "tiny" and "threads" in record["machine"]


def test_calibrate_on_a_prompts_files_eval_split(small_checkpoint, small_drafters, tmp_path, capsys):
    """train calibrate --prompts fits on that file's eval prompts 40..79 of each domain (benchmarks report on
    0..39) and says so in what it stores; a file with too few eval prompts is one line and stores nothing."""
    drafter = tmp_path / "d.safetensors"
    for suffix in (".safetensors", ".json"):
        drafter.with_suffix(suffix).write_bytes(small_drafters["dspark"].with_suffix(suffix).read_bytes())
    records = [{"prompt": f"train question {i}", "domain": "chat", "split": "train"} for i in range(50)]
    records += [{"prompt": f"held-out question {i}", "domain": "chat", "split": "eval"} for i in range(41)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    argv = ["calibrate", "--drafter", "dspark", "--drafter-checkpoint", str(drafter), "--checkpoint",
            str(small_checkpoint), "--gamma", "3", "--max-new-tokens", "4", "--samples", "1"]  # fmt: skip
    assert run_main(train.main, [*argv, "--prompts", str(prompts)]) == 0
    assert "chat: " in capsys.readouterr().out  # one domain: the file's
    stored = json.loads(drafter.with_suffix(".json").read_text())
    assert str(prompts) in json.dumps(stored)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))  # 40 eval prompts: none to fit on
    before = drafter.with_suffix(".json").read_text()
    assert run_main(train.main, [*argv, "--prompts", str(prompts)]) == 2
    assert "fewer than 41 prompts per domain" in capsys.readouterr().err
    assert drafter.with_suffix(".json").read_text() == before
