"""Nothing a user runs writes into the package, and bad values are refused where they enter (#41).

* Shipped files are read-only to the commands: `train calibrate` of a shipped drafter stores its calibration
  under DSPARK_HOME (read there first by `generate`/`bench`), `train drafter` writes under DSPARK_HOME unless
  told `--out`/`--ship`; a calibration is checked as it is read (length, finite temperatures > 0).
* A Hugging Face config.json is checked as it is read (an object, integer sizes, weights that fit in memory and
  are floating-point).

The core's own input checks (token ids, counts, arrival times, probabilities) and the Ctrl-C hook are in tests/core/
(test_decoding, test_engine, test_sampling, test_tokenizer, test_init). The one-line command-line errors of the same
issue are rows of tests/lab/test_bad_inputs.py (`broken_calibrations` and `broken_hf_configs` in tests/helpers.py
make their files).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import HF_CONFIG, HUGE, ROOT, TINY

from dspark import train
from dspark.checkpoint import ASSETS_DIR, CheckpointError, config_path
from dspark.lab.calibration import calibration_path, get_calibration, load_calibration
from dspark.lab.cli import run_main
from dspark.lab.commands import generate
from dspark.lab.pretrained.hf_dir import hyperparameters
from dspark.lab.pretrained.llama import build_model, check_memory, parameter_count

SHIPPED_DSPARK = ASSETS_DIR / "drafter_dspark.safetensors"


# ---- 1. shipped files are read-only to the commands -----------------------------------------------------
def git_status(path: Path) -> str:
    done = subprocess.run(
        ["git", "status", "--porcelain", "--", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.strip()})")
    return done.stdout


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.skipif(not SHIPPED_DSPARK.is_file(), reason="needs the shipped dspark drafter")
def test_calibrating_the_shipped_drafter_writes_under_dspark_home(home, monkeypatch):
    """The issue's command, `train calibrate --gamma 2` on the shipped target and drafter, used to rewrite the
    tracked drafter_dspark.json (7 positions became 2). Now the package is untouched, the calibration lands in
    DSPARK_HOME covering all 7 positions, and `generate` reads it from there."""
    before, shipped = git_status(ASSETS_DIR), config_path(SHIPPED_DSPARK).read_bytes()
    assert run_main(train.main, ["calibrate", "--gamma", "2", "--max-new-tokens", "2", "--samples", "1"]) == 0
    assert git_status(ASSETS_DIR) == before == ""
    assert config_path(SHIPPED_DSPARK).read_bytes() == shipped
    stored = home / "calibration" / "drafter_dspark.json"
    assert calibration_path(SHIPPED_DSPARK) == stored
    record = json.loads(stored.read_text())["calibration"]
    assert len(record["sts_temperatures"]) == len(record["sts_shifts"]) == 7 and record["gamma"] == 2

    # generate reads the calibration under DSPARK_HOME before the shipped one
    record["sts_temperatures"] = [1.5] * 7
    stored.write_text(json.dumps({"calibration": record}))
    seen = []

    def no_scheduler(policy, drafter, model, gamma, temperatures, *args, **kwargs):
        seen.append(temperatures)
        return None  # verify every draft: the SPS profile is not measured

    monkeypatch.setattr(generate, "measured_scheduler", no_scheduler)
    assert run_main(generate.main, ["hi", "--policy", "dspark", "--max-new-tokens", "2"]) == 0
    assert seen[0][0].tolist() == [1.5] * 7 and get_calibration("dspark")[0].tolist() == [1.5] * 7

    # one fitted for other weights (the drafter was retrained since) is passed over for the shipped one
    record["checkpoint_sha256"] = "0" * 64
    stored.write_text(json.dumps({"calibration": record}))
    assert get_calibration("dspark").tolist() == load_calibration(SHIPPED_DSPARK).tolist()


def test_calibrate_with_out_and_a_shorter_gamma(small_checkpoint, small_drafters, tmp_path, home):
    """--out takes the calibration and leaves the drafter's own JSON alone; fitted over --gamma 2 positions of
    a γ = 3 drafter it still covers all 3 (T = 1, b = 0 beyond), so it loads for that drafter."""
    twin = config_path(small_drafters["dspark"]).read_bytes()
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--checkpoint", str(small_checkpoint), "--drafter-checkpoint", str(small_drafters["dspark"]),
            "--gamma", "2", "--max-new-tokens", "2", "--samples", "1", "--out", str(out)]  # fmt: skip
    assert run_main(train.main, argv) == 0
    assert config_path(small_drafters["dspark"]).read_bytes() == twin
    temps, shifts = load_calibration(out, positions=3).tolist()
    assert len(temps) == 3 and (temps[2], shifts[2]) == (1.0, 0.0)
    assert not home.exists() or not any(home.rglob("*.json"))  # an explicit --out is the only place written


def test_train_drafter_writes_under_dspark_home(small_checkpoint, tmp_path, home, capsys):
    """Without --out, `train drafter` used to write dspark/assets/drafter_<kind>.safetensors."""
    responses = tmp_path / "r.jsonl"
    g = torch.Generator().manual_seed(0)
    rows = [{"domain": domain, "split": split, "prompt_ids": torch.randint(10, 500, (5,), generator=g).tolist(),
             "response_ids": torch.randint(10, 500, (8,), generator=g).tolist()}
            for domain in ("code", "math", "chat") for split in ("train", "val")]  # fmt: skip
    responses.write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = git_status(ASSETS_DIR)
    argv = ["drafter", "--kind", "mtp", "--checkpoint", str(small_checkpoint), "--responses", str(responses), "--live",
            "--steps", "1", "--eval-every", "1", "--batch-size", "1"]  # fmt: skip
    assert run_main(train.main, argv) == 0
    assert (home / "drafters" / "drafter_mtp.safetensors").is_file()
    assert git_status(ASSETS_DIR) == before
    assert "--ship copies it into the package" in capsys.readouterr().out


@pytest.mark.parametrize("calibration, message", [
    ({"sts_temperatures": [1.0, 1.0]}, "has 2 positions but the drafter drafts 3"),
    ({"sts_temperatures": [1.0, math.nan, 1.0]}, "finite numbers > 0, got nan at position 2"),
    ({"sts_temperatures": [1.0, 0.0, 1.0]}, "finite numbers > 0, got 0.0 at position 2"),
    ({"sts_temperatures": [1.0, -2.0, 1.0]}, "finite numbers > 0, got -2.0"),
    ({"sts_temperatures": [1.0, 1.0, 1.0], "sts_shifts": [0.0, math.inf, 0.0]}, "sts_shifts must be finite numbers"),
    ({"sts_temperatures": [1.0, 1.0, 1.0], "sts_shifts": [0.0]}, "sts_shifts has 1 entries"),
    ({"sts_temperatures": "1.0"}, "must be a non-empty list"),
    ({"sts_temperatures": [1.0, True, 1.0]}, "got True"),
    ([1.0], "'calibration' must be a JSON object"),
])  # fmt: skip
def test_a_bad_calibration_is_one_line_naming_its_file(tmp_path, calibration, message):
    path = tmp_path / "drafter_dspark.json"
    path.write_text(json.dumps({"config": {"kind": "dspark", "gamma": 3}, "calibration": calibration}))
    with pytest.raises(CheckpointError) as err:
        get_calibration("dspark", tmp_path / "drafter_dspark.safetensors")  # positions from the config: 3
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("edit, message", [
    (lambda c: [c], "holds a JSON list, not an object"),
    (lambda c: c | {"num_hidden_layers": 2.7}, "num_hidden_layers must be an integer, got 2.7"),
    (lambda c: c | {"hidden_size": "48"}, "hidden_size must be an integer, got '48'"),
    (lambda c: c | {"vocab_size": True}, "vocab_size must be an integer, got True"),
    (lambda c: c | {"rope_theta": "1e4"}, "rope_theta must be a number"),
    (lambda c: c | {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    (lambda c: {k: v for k, v in c.items() if k != "intermediate_size"}, "lacks 'intermediate_size'"),
])  # fmt: skip
def test_a_hugging_face_config_is_checked(edit, message):
    with pytest.raises(CheckpointError, match=message):
        hyperparameters(edit(dict(HF_CONFIG)), Path("m"))
    assert hyperparameters(dict(HF_CONFIG), Path("m")).n_layers == 3


def test_a_model_too_big_for_memory_is_refused_before_allocating():
    from dspark.lab.pretrained.llama import model_config

    config = model_config(hyperparameters({**HF_CONFIG, **HUGE}, Path("m")))
    with pytest.raises(CheckpointError, match="GiB in fp32, more than the .* GiB of memory available"):
        check_memory(config, "m")
    small = model_config(hyperparameters(dict(HF_CONFIG), Path("m")))
    with torch.device("meta"):
        from dspark.model import Transformer

        model = Transformer(small)
    assert parameter_count(small) == sum(p.numel() for p in model.parameters())  # tied: the embedding once


def test_integer_weights_are_refused_not_cast(tiny_model):
    tensors = dict(tiny_model.state_dict())
    assert build_model(TINY, tensors, "m").config == TINY
    tensors["norm.weight"] = tensors["norm.weight"].long()
    with pytest.raises(CheckpointError, match=r"weights must be floating-point, got norm.weight \(int64\)"):
        build_model(TINY, tensors, "m")
