"""Nothing a user runs writes into the package, and bad values are refused where they enter (#41).

* Shipped files are read-only to the commands: `train calibrate` of a shipped drafter stores its calibration
  under DSPARK_HOME (read there first by `generate`/`bench`), `train drafter` writes under DSPARK_HOME unless
  told `--out`/`--ship`; a calibration is checked as it is read (length, finite temperatures > 0).
* The Python API validates what comes in, once per call on the host: token ids (integers in the vocabulary),
  counts (integers), arrival times (>= 0), probabilities (finite, non-negative, with mass), and a Hugging Face
  config.json (an object, integer sizes, weights that fit in memory and are floating-point).
* Ctrl-C while a command is still importing torch prints `interrupted` and exits 130.

The one-line command-line errors of the same issue are rows of tests/test_bad_inputs.py (`broken_calibrations`
and `broken_hf_configs` below make their files).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY
from test_speculative import GREEDY, make_drafter, prompts

from dspark import train
from dspark.checkpoint import ASSETS_DIR, CheckpointError, config_path
from dspark.decoding import generate as plain_generate
from dspark.drafters import load_calibration
from dspark.engine import Engine, Request, speculative_generate
from dspark.lab.calibration import calibration_path, get_calibration
from dspark.lab.cli import run_main
from dspark.lab.commands import generate
from dspark.lab.pretrained.hf_dir import hyperparameters
from dspark.lab.pretrained.llama import build_model, check_memory, parameter_count
from dspark.sampling import sample

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_DSPARK = ASSETS_DIR / "drafter_dspark.safetensors"


# ---- files for tests/test_bad_inputs.py -----------------------------------------------------------------
def broken_calibrations(root: Path, drafter: Path) -> dict[str, str]:
    """Copies of the small γ = 3 dspark drafter whose JSON holds a calibration that is too short (cal_short),
    holds NaN (cal_nan) or a negative temperature (cal_negative); NAME_json is the JSON's path."""
    out = {}
    for name, temps in (
        ("cal_short", [1.0, 1.0]),
        ("cal_nan", [1.0, math.nan, 1.0]),
        ("cal_negative", [1.0, -0.5, 1.0]),
    ):
        path = root / f"{name}.safetensors"
        shutil.copy(drafter, path)
        record = json.loads(config_path(drafter).read_text())
        record["calibration"] = {"sts_temperatures": temps, "sts_shifts": [0.0] * len(temps)}
        config_path(path).write_text(json.dumps(record))  # NaN is written as NaN, which json reads back
        out[name], out[f"{name}_json"] = str(path), str(config_path(path))
    return out


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80,
             "max_position_embeddings": 64, "tie_word_embeddings": True}  # fmt: skip
HUGE = {"vocab_size": 2**24, "hidden_size": 2**20, "num_hidden_layers": 1000, "num_attention_heads": 16,
        "num_key_value_heads": 16, "intermediate_size": 2**22}  # fmt: skip


def broken_hf_configs(root: Path) -> dict[str, str]:
    """Hugging Face-layout folders whose config.json is a JSON list (hf_list), says 2.7 layers (hf_fraction) or
    describes a model no machine holds (hf_huge); none needs weights: each is refused before they are read."""
    configs = {
        "hf_list": [1, 2],
        "hf_fraction": {**HF_CONFIG, "num_hidden_layers": 2.7},
        "hf_huge": {**HF_CONFIG, **HUGE},
    }
    out = {}
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        out[name] = str(root / name)
    return out


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


# ---- 4. the API's inputs are validated where they enter ---------------------------------------------------
BAD_PROMPTS = [
    ([[1.5, 2]], "token 1 is 1.5, not an integer"),
    ([[3, True]], "token 2 is True, not an integer"),
    ([[4, 5], [-1, 3]], "prompt 2: token id -1 is outside the vocabulary 0..96"),
    ([[TINY.vocab_size]], f"prompt 1: token id {TINY.vocab_size} is outside the vocabulary"),
    ([torch.tensor([1, 2])], "prompt 1 is a Tensor, not a list"),
]


@pytest.mark.parametrize("ps, message", BAD_PROMPTS)
@pytest.mark.parametrize("entry", ["generate", "speculative_generate"])
def test_bad_token_ids_are_a_clear_value_error(tiny_model, entry, ps, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        if entry == "generate":
            plain_generate(tiny_model, ps, 4, GREEDY)
        else:
            speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), ps, 4, GREEDY, 1)


@pytest.mark.parametrize("budget", [4.5, True, 0, "4"])
def test_max_new_tokens_must_be_an_integer(tiny_model, budget):
    for call in (lambda: plain_generate(tiny_model, prompts([3]), budget, GREEDY),
                 lambda: speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), prompts([3]), budget, GREEDY, 1)):  # fmt: skip
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            call()


@pytest.mark.parametrize("request_, message", [
    (Request([1, 2], 4, -1.0), "request 2: the arrival time must be a finite number of seconds >= 0, got -1.0"),
    (Request([1, 2], 4, math.nan), "arrival time must be"),
    (Request([1, 2], 4, math.inf), "arrival time must be"),
    (Request([1, 2], 4.5), "request 2: max_new_tokens must be an integer"),
    (Request([1, 2.0], 4), "request 2: token 2 is 2.0"),
    (Request([1, 500], 4), "request 2: token id 500 is outside the vocabulary"),
])  # fmt: skip
def test_the_engine_refuses_what_it_cannot_serve(tiny_model, request_, message):
    """A negative arrival used to be served with a TTFT of 100 s; requests are numbered from 1."""
    engine = Engine(tiny_model, make_drafter("mtp", tiny_model, 1), GREEDY, 1, 2)
    with pytest.raises(ValueError, match=message):
        engine.run([Request([3, 4], 4), request_])


def test_the_engine_still_serves_good_requests_with_arrival_times(tiny_model):
    engine = Engine(tiny_model, make_drafter("mtp", tiny_model, 1), GREEDY, 1, 2)
    result = engine.run([Request(p, 3, a) for p, a in zip(prompts([3, 4]), (0, 0.001))])
    assert [len(r.tokens) for r in result.records] == [3, 3]


@pytest.mark.parametrize("probs, message", [
    (torch.zeros(2, 5), "no mass"),
    (torch.tensor([[0.5, math.nan, 0.5]]), "not all finite"),
    (torch.tensor([[0.5, -0.1, 0.6]]), "negative"),
    (torch.tensor([[0.5, math.inf, 0.5]]), "not all finite"),
])  # fmt: skip
def test_sampling_needs_a_distribution(probs, message):
    with pytest.raises(ValueError, match=message):
        sample(probs, torch.Generator().manual_seed(0))


def test_sampling_a_distribution_still_works():
    probs = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert sample(probs, torch.Generator().manual_seed(0)).tolist() == [2, 0]


@pytest.mark.parametrize("ids, message", [([4096], "outside the tokenizer's vocabulary 0..4095"),
                                          ([-1], "outside"), ([1.5], "must be integers"), ([True], "integers")])  # fmt: skip
def test_decode_refuses_ids_outside_the_vocabulary(tokenizer, ids, message):
    with pytest.raises(ValueError, match=message):
        tokenizer.decode([100, *ids])
    assert tokenizer.decode(torch.tensor([100, 200])) == tokenizer.decode([100, 200])


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


# ---- 5. Ctrl-C while a command starts --------------------------------------------------------------------
@pytest.mark.parametrize("after", ["torch.", "dspark.engine"])
def test_ctrl_c_while_importing_is_one_line_and_130(small_checkpoint, tmp_path, after):
    """SIGINT once `-X importtime` reports a module `after` imported: inside torch's own import (the package's
    __init__ imports torch first) or after it, before the command's main runs. Timing-tolerant: the signal is
    sent on that line, wherever the process has got to by then it must end the same way."""
    argv = [sys.executable, "-X", "importtime", "-m", "dspark.generate", "hi", "--checkpoint", str(small_checkpoint),
            "--drafter", "none", "--max-new-tokens", "100"]  # fmt: skip
    env = {**os.environ, "DSPARK_HOME": str(tmp_path)}
    # the child starts with SIGINT's default action even when these tests run in a background job (`pytest &`),
    # whose children inherit an ignored SIGINT from the shell: Python then keeps it ignored and Ctrl-C does nothing
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        for line in proc.stderr:
            if line.startswith("import time:") and line.rstrip().split("|")[-1].strip().startswith(after):
                proc.send_signal(signal.SIGINT)
                break
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    said = [ln for ln in rest.splitlines() if ln.strip() and not ln.startswith("import time:")]
    assert proc.returncode == 130 and said == ["interrupted"], (proc.returncode, rest[-2000:])
