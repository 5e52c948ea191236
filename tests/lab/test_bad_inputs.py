"""Every bad input a user tried gets ONE clear line on stderr, a non-zero exit and no traceback.

One parametrised table over `generate`, `bench`, `train` and `grade`: each row is a command line
(and an environment) that once ended in a traceback, a hang, a silent acceptance or an unclear
message, or one that was already handled. Each asserts the exit status, exactly one stderr line
that names the problem, and no "Traceback". The commands run in-process through `run_main`, as
`python -m` runs them; the few cases that need a real process (a closed pipe) run one.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import broken_calibrations, broken_hf_configs, corrupt_cache_homes

from dspark import bench, export, generate, grade, train
from dspark.lab import storage
from dspark.lab.cli import run_main
from dspark.lab.commands import generate as generate_command
from dspark.lab.storage import save_checkpoint
from dspark.model import Transformer
from dspark.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"generate": generate, "bench": bench, "train": train, "grade": grade, "export": export}


@pytest.fixture(scope="module")
def files(small_checkpoint, small_drafters, tmp_path_factory) -> dict[str, str]:
    """Paths the table's rows refer to by name ({name} in an argument)."""
    root = tmp_path_factory.mktemp("bad")
    out = {"tiny": str(small_checkpoint), **{k: str(v) for k, v in small_drafters.items()}, "tmp": str(root)}
    blocker = root / "a_file"
    blocker.write_text("not a folder\n")
    out["file"] = str(blocker)
    garbage = root / "responses.jsonl"
    garbage.write_text("this is not json\n")
    out["garbage"] = str(garbage)

    def variant(name: str, edit) -> str:  # a copy of the tiny checkpoint with its JSON twin edited
        path = root / f"{name}.safetensors"
        shutil.copy(small_checkpoint, path)
        record = json.loads(small_checkpoint.with_suffix(".json").read_text())
        edit(record["config"])
        path.with_suffix(".json").write_text(json.dumps(record))
        return str(path)

    out["heads0"] = variant("heads0", lambda c: c.update(n_heads=0))
    out["wide"] = variant("wide", lambda c: c.update(ffn_hidden=96))
    nan_model = Transformer(json_config(small_checkpoint))
    with torch.no_grad():
        nan_model.blocks[0].attn.wq.weight[0, 0] = math.nan
    save_checkpoint(nan_model, nan_model.config, root / "nan.safetensors")
    out["nan"] = str(root / "nan.safetensors")
    truncated = root / "truncated.safetensors"
    truncated.write_bytes(Path(small_drafters["dspark"]).read_bytes()[:200])
    shutil.copy(Path(small_drafters["dspark"]).with_suffix(".json"), truncated.with_suffix(".json"))
    out["truncated"] = str(truncated)
    # prompts files (--prompts): empty, bad JSON on line 3, one prompt beyond the tiny target's context
    (root / "empty_prompts.txt").write_text("\n  \n")
    (root / "bad_prompts.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": oops}\n')
    (root / "long_prompts.jsonl").write_text(
        '{"prompt": "hi"}\n' + json.dumps({"prompt": "word " * 600}) + "\n"
    )
    for name in ("empty_prompts.txt", "bad_prompts.jsonl", "long_prompts.jsonl"):
        out[name.split(".")[0]] = str(root / name)
    # what an interrupted `train drafter` leaves next to its --out
    (root / "interrupted.trainer.pt").write_bytes(b"a run's state")
    out["interrupted"] = str(root / "interrupted.safetensors")
    # DSPARK_HOMEs whose profile caches are broken (#41): empty_sps_home, empty_sps (its file), ...
    out |= corrupt_cache_homes(root, small_checkpoint, small_drafters["dspark"])
    # drafters with a broken calibration (cal_short, cal_nan, cal_negative) and broken config.json folders (#41)
    out |= broken_calibrations(root, small_drafters["dspark"]) | broken_hf_configs(root)
    return out


def json_config(checkpoint: Path):
    from dspark.model import ModelConfig

    return ModelConfig.from_dict(json.loads(checkpoint.with_suffix(".json").read_text())["config"])


TINY = ["--checkpoint", "{tiny}"]
BAD_UTF8 = b"caf\xff".decode("utf-8", "surrogateescape")  # how Python hands over undecodable argv bytes

# (id, command, argv, environment, what the one line must contain)
CASES = [
    # generate: once tracebacks
    ("utf8-prompt", "generate", [BAD_UTF8, *TINY, "--drafter", "none"], {}, "not valid UTF-8"),
    ("utf8-prompt-json", "generate", [BAD_UTF8, "--json", *TINY, "--drafter", "none"], {}, "not valid UTF-8"),
    ("threads-negative", "generate", ["hi", "--threads", "-1"], {}, "--threads"),
    ("kernels-env", "generate", ["hi", *TINY, "--drafter", "none"], {"DSPARK_KERNELS": "bogus"}, "DSPARK_KERNELS"),
    ("config-heads-0", "generate", ["hi", "--checkpoint", "{heads0}"], {}, "n_heads"),
    ("config-mismatch", "generate", ["hi", "--checkpoint", "{wide}"], {}, "size mismatch"),
    # generate: silently accepted or unclear before
    ("temperature-inf", "generate", ["hi", "--temperature", "inf"], {}, "--temperature"),
    ("temperature-nan", "generate", ["hi", "--temperature", "nan"], {}, "--temperature"),
    ("temperature-underflow", "generate", ["hi", *TINY, "--drafter", "none", "--temperature", "1e-39"], {},
     "temperature"),
    ("threshold-nan", "generate", ["hi", "--threshold", "nan"], {}, "--threshold"),
    ("threshold-negative", "generate", ["hi", "--threshold", "-1"], {}, "--threshold"),
    ("gamma-without-drafter", "generate", ["hi", *TINY, "--drafter", "none", "--gamma", "3"], {}, "--gamma"),
    ("gamma-negative", "generate", ["hi", "--drafter", "none", "--gamma", "-3"], {}, "--gamma"),
    ("gamma-mtp-5", "generate", ["hi", *TINY, "--drafter", "mtp", "--drafter-checkpoint", "{mtp}", "--gamma",
                                 "5"], {}, "--gamma must be in 1..1"),
    ("gamma-mtp-0", "generate", ["hi", "--drafter", "mtp", "--gamma", "0"], {}, "--gamma"),
    ("gamma-too-long", "generate", ["hi", *TINY, "--drafter", "eagle", "--drafter-checkpoint", "{eagle}",
                                    "--gamma", "9"], {}, "--gamma must be in 1..3"),
    ("seed-huge", "generate", ["hi", "--seed", str(2**70)], {}, "--seed"),
    ("top-k-beyond-vocab", "generate", ["hi", *TINY, "--drafter", "none", "--top-k", "100000"], {}, "--top-k"),
    ("top-p-zero", "generate", ["hi", *TINY, "--drafter", "none", "--top-p", "0"], {}, "top-p"),
    ("wrong-kind-dspark", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint", "{eagle}"], {},
     "holds a eagle drafter"),
    ("wrong-kind-eagle", "generate", ["hi", *TINY, "--drafter", "eagle", "--drafter-checkpoint", "{mtp}"], {},
     "holds a mtp drafter"),
    ("truncated-drafter", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint", "{truncated}"],
     {}, "truncated"),
    ("nan-weights", "generate", ["hi", "--checkpoint", "{nan}", "--drafter", "none"], {}, "NaN"),
    ("confidence-policy-dflash", "generate", ["hi", "--drafter", "dflash", "--policy", "dspark"], {},
     "no trained confidence head"),
    # generate: already handled
    ("empty-prompt", "generate", ["   ", *TINY, "--drafter", "none"], {}, "prompt is empty"),
    ("prompt-too-long", "generate", ["word " * 400, *TINY, "--drafter", "none"], {}, "context"),
    ("max-new-tokens-0", "generate", ["hi", "--max-new-tokens", "0"], {}, "--max-new-tokens"),
    ("missing-checkpoint", "generate", ["hi", "--checkpoint", "/nonexistent/model.safetensors"], {}, "not found"),
    ("unknown-option", "generate", ["hi", "--bogus"], {}, "unrecognized arguments"),
    ("unknown-drafter", "generate", ["hi", "--drafter", "nope"], {}, "invalid choice"),
    # refusals and messages (#41)
    ("calibration-wrong-length", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint",
     "{cal_short}"], {}, "{cal_short_json}: the calibration has 2 positions but the drafter drafts 3"),
    ("calibration-nan", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint", "{cal_nan}"], {},
     "sts_temperatures must be finite numbers > 0, got nan at position 2"),
    ("calibration-negative", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint",
     "{cal_negative}"], {}, "sts_temperatures must be finite numbers > 0, got -0.5"),
    ("threads-huge", "generate", ["hi", "--threads", "100000"], {}, "--threads: must be 0.."),
    ("threads-huge-bench", "bench", ["serve", "--threads", "100000"], {}, "--threads: must be 0.."),
    ("model-empty", "generate", ["hi", "--model", ""], {}, "--model is empty"),
    ("hf-config-list", "generate", ["hi", "--model", "{hf_list}"], {}, "config.json holds a JSON list"),
    ("hf-config-fraction", "generate", ["hi", "--model", "{hf_fraction}"], {},
     "num_hidden_layers must be an integer, got 2.7"),
    ("hf-config-huge", "generate", ["hi", "--model", "{hf_huge}"], {}, "GiB of memory available"),
    ("none-with-drafter-checkpoint", "generate", ["hi", *TINY, "--drafter", "none", "--drafter-checkpoint",
     "{dspark}"], {}, "--drafter none decodes plainly: drop --drafter-checkpoint"),
    ("none-with-policy", "generate", ["hi", *TINY, "--drafter", "none", "--policy", "dspark"], {},
     "drop --policy"),
    ("offline-label-twice", "bench", ["offline", *TINY, "--drafters", "a={mtp},a={eagle}"], {},
     "the label 'a' is given twice"),
    ("offline-label-empty", "bench", ["offline", *TINY, "--drafters", "={mtp}"], {}, "has no label"),
    ("drafter-for-another-target", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint",
     str(ROOT / "dspark/assets/smollm2-135m/drafter_dspark.safetensors")], {},
     "trained for the target 'smollm2-135m'"),
    ("target-as-drafter", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint", "{tiny}"], {},
     "is a target model checkpoint, not a drafter"),
    ("checkpoint-gguf", "generate", ["hi", "--checkpoint", "{tmp}/model.gguf"], {}, "pass it as --model"),
    ("checkpoint-folder", "generate", ["hi", "--checkpoint", "{tmp}"], {}, "is a folder"),
    ("calibrate-ship-and-out", "train", ["calibrate", *TINY, "--drafter-checkpoint", "{dspark}", "--ship", "--out",
     "{tmp}/c.json"], {}, "give one"),
    ("calibrate-ship-own-drafter", "train", ["calibrate", *TINY, "--drafter-checkpoint", "{dspark}", "--ship"], {},
     "is not one"),
    ("prompts-file-missing", "generate", ["--prompts", "{tmp}/none.txt", *TINY, "--drafter", "none"], {},
     "not found"),
    ("prompts-file-empty", "generate", ["--prompts", "{empty_prompts}", *TINY, "--drafter", "none"], {}, "is empty"),
    ("prompts-file-bad-json", "generate", ["--prompts", "{bad_prompts}", *TINY, "--drafter", "none"], {},
     "{bad_prompts} line 3: not JSON"),
    ("prompts-file-too-long", "generate", ["--prompts", "{long_prompts}", *TINY, "--drafter", "none"], {},
     "{long_prompts} line 2"),
    ("prompts-file-and-text", "generate", ["hi", "--prompts", "{bad_prompts}", *TINY], {}, "not both"),
    ("offline-prompts-bad-json", "bench", ["offline", "--prompts", "{bad_prompts}", *TINY, "--drafters", "mtp=" +
     "{mtp}"], {},
     "{bad_prompts} line 3"),
    ("offline-prompts-too-long", "bench", ["offline", "--prompts", "{long_prompts}", *TINY, "--drafters", "mtp=" +
     "{mtp}"], {}, "{long_prompts} line 2"),
    ("serve-prompts-empty", "bench", ["serve", "--prompts", "{empty_prompts}", *TINY], {}, "is empty"),
    ("responses-prompts-bad-json", "train", ["responses", "--prompts", "{bad_prompts}", *TINY], {},
     "{bad_prompts} line 3"),
    ("instructions-out-empty", "train", ["instructions", "--out", ""], {}, "--out is empty"),
    # outputs where asked (#41)
    ("json-empty", "bench", ["appendix-a", "--draws", "3", "--json", ""], {}, "--json is empty"),
    ("out-empty", "bench", ["profile", *TINY, "--out", ""], {}, "--out is empty"),
    ("data-out-empty", "train", ["data", "--out", ""], {}, "--out is empty"),
    ("responses-out-empty", "train", ["responses", "--out", " "], {}, "--out is empty"),
    ("profile-cache-empty", "bench", ["profile", *TINY], {"DSPARK_HOME": "{empty_sps_home}"},
     "cache file {empty_sps} is unreadable (empty): pass --refresh"),
    ("profile-cache-not-json", "bench", ["profile", *TINY], {"DSPARK_HOME": "{garbage_sps_home}"},
     "cache file {garbage_sps} is unreadable (not JSON"),
    ("generate-draft-cost-cache-empty", "generate", ["hi", *TINY, "--drafter", "dspark", "--drafter-checkpoint",
     "{dspark}", "--policy", "dspark"], {"DSPARK_HOME": "{empty_draft_home}"}, "{empty_draft} is unreadable"),
    ("draft-cost-cache-empty", "bench", ["profile", *TINY, "--drafters", "dspark={dspark}"],
     {"DSPARK_HOME": "{empty_draft_home}"}, "cache file {empty_draft} is unreadable (empty): pass --refresh"),
    # bench
    ("serve-threads", "bench", ["serve", "--threads", "-1"], {}, "--threads"),
    ("serve-poisson-tiny", "bench", ["serve", "--poisson", "1e-9"], {}, "--poisson"),
    ("serve-poisson-zero", "bench", ["serve", "--poisson", "0"], {}, "--poisson"),
    ("serve-one-token", "bench", ["serve", "--max-new-tokens", "1"], {}, "--max-new-tokens"),
    ("serve-unknown-policy", "bench", ["serve", "--policy", "fastest"], {}, "unknown policy"),
    ("ar-one-token", "bench", ["ar", "--max-new-tokens", "1"], {}, "--max-new-tokens"),
    ("ar-batch-1000", "bench", ["ar", "--batch-sizes", "1000"], {}, "--batch-sizes"),
    ("offline-gamma-0", "bench", ["offline", "--gamma", "0"], {}, "--gamma"),
    ("offline-missing-checkpoint", "bench", ["offline", "--drafters", "x=/nonexistent.safetensors"], {},
     "no drafter checkpoint at /nonexistent.safetensors"),
    ("offline-unknown-drafter", "bench", ["offline", "--drafters", "medusa"], {}, "unknown drafter 'medusa'"),
    ("offline-gamma-100", "bench", ["offline", "--drafters", "eagle", "--gamma", "100"], {}, "--gamma"),
    ("json-under-a-file", "bench", ["appendix-a", "--draws", "3", "--json", "{file}/out.json"], {}, "is a file"),
    ("out-under-a-file", "bench", ["profile", *TINY, "--out", "{file}/dir"], {}, "is a file"),
    ("json-is-a-folder", "bench", ["appendix-a", "--draws", "3", "--json", "{tmp}"], {}, "is a folder"),
    ("appendix-seed-huge", "bench", ["appendix-a", "--seed", str(2**70)], {}, "--seed"),
    ("appendix-draws", "bench", ["appendix-a", "--draws", "2"], {}, "--draws"),
    ("thresholds-above-1", "bench", ["threshold", "--thresholds", "0.5,2"], {}, "--thresholds"),
    ("prompts-per-domain-0", "bench", ["offline", "--prompts-per-domain", "0"], {}, "--prompts-per-domain"),
    ("prompts-per-domain-81", "bench", ["depth", "--prompts-per-domain", "81"], {}, "--prompts-per-domain must be 1..80"),
    ("calibration-dflash", "bench", ["calibration", "--drafter", "dflash"], {}, "no trained confidence head"),
    ("confidence-dflash", "bench", ["confidence", "--drafter", "dflash", "--prompts-per-domain", "1",
     "--fit-prompts-per-domain", "1"], {}, "no trained confidence head"),
    ("confidence-greedy", "bench", ["confidence", "--temperature", "0"], {}, "--temperature must be > 0"),
    ("confidence-fit-41", "bench", ["confidence", "--fit-prompts-per-domain", "41"], {}, "--fit-prompts-per-domain"),
    ("kernels-gamma-0", "bench", ["kernels", "--gamma", "0"], {}, "--gamma"),
    ("policies-transformers-tiny", "bench", ["policies", "--transformers"], {}, "give --model"),
    # train
    ("target-heads-0", "train", ["target", "--heads", "0"], {}, "--heads"),
    ("target-seq-len-0", "train", ["target", "--seq-len", "0"], {}, "--seq-len"),
    ("target-context-0", "train", ["target", "--context", "0"], {}, "--context"),
    ("target-eval-every-0", "train", ["target", "--eval-every", "0"], {}, "--eval-every"),
    ("target-batch-0", "train", ["target", "--batch-size", "0"], {}, "--batch-size"),
    ("target-lr-nan", "train", ["target", "--lr", "nan"], {}, "--lr"),
    ("bench-training-settings", "bench", ["training", "--settings", "cache:all:fp32"], {}, "--settings"),
    ("drafter-steps-negative", "train", ["drafter", "--kind", "dspark", "--steps", "-1"], {}, "--steps"),
    ("drafter-anchors-negative", "train", ["drafter", "--kind", "dspark", "--anchors", "-1"], {}, "--anchors"),
    ("drafter-epochs-negative", "train", ["drafter", "--kind", "dspark", "--epochs", "-0.5"], {}, "--epochs"),
    ("drafter-taps-out-of-range", "train", ["drafter", "--kind", "dspark", *TINY, "--taps", "0", "9"], {}, "--taps"),
    ("drafter-ce-weight-above-1", "train", ["drafter", "--kind", "dspark", "--ce-weight", "1.5"], {}, "--ce-weight"),
    ("drafter-eval-every-0", "train", ["drafter", "--kind", "dspark", "--eval-every", "0"], {}, "--eval-every"),
    ("drafter-eagle-gamma-0", "train", ["drafter", "--kind", "eagle", "--gamma", "0"], {}, "--gamma"),
    ("drafter-layers-negative", "train", ["drafter", "--kind", "dspark", "--layers", "-1"], {}, "--layers"),
    ("drafter-batch-0", "train", ["drafter", "--kind", "dspark", "--batch-size", "0"], {}, "--batch-size"),
    ("drafter-garbage-responses", "train", ["drafter", "--kind", "mtp", *TINY, "--responses", "{garbage}"], {},
     "{garbage} line 1"),
    ("drafter-missing-responses", "train", ["drafter", "--kind", "mtp", "--responses", "/nonexistent.jsonl"], {},
     "not found"),
    ("drafter-interrupted-run-left", "train", ["drafter", "--kind", "mtp", *TINY, "--out", "{interrupted}"], {},
     "pass --resume"),
    ("calibrate-gamma-0", "train", ["calibrate", "--gamma", "0"], {}, "--gamma"),
    ("responses-nothing", "train", ["responses", "--per-domain", "0", "--val-per-domain", "0"], {},
     "nothing to generate"),
    ("responses-batch-0", "train", ["responses", "--batch-size", "0"], {}, "--batch-size"),
    ("responses-out-gzipped", "train", ["responses", "--out", "{tmp}/r.jsonl.gz"], {}, "plain JSON lines"),
    ("data-math-negative", "train", ["data", "--math-problems", "-1"], {}, "--math-problems"),
    ("data-out-under-a-file", "train", ["data", "--out", "{file}/corpus"], {}, "{file}"),
    ("target-without-corpus", "train", ["target", "--data", "{tmp}/none", "--out", "{tmp}/run"], {},
     "python -m dspark.train data"),
    ("train-unknown-command", "train", ["fly"], {}, "invalid choice"),
    # export (#42)
    ("export-no-qk-norm", "export", ["--drafter", "dspark", *TINY, "--drafter-checkpoint", "{dspark}", "--out",
                                     "{tmp}/export"], {}, "no per-head q/k RMSNorm"),
    ("export-eagle-layer", "export", ["--drafter", "eagle", *TINY, "--drafter-checkpoint", "{eagle}", "--out",
                                      "{tmp}/export"], {}, "EAGLE-3's 2 x dim attention input"),
    ("export-eagle-as-deepspec", "export", ["--drafter", "eagle", *TINY, "--drafter-checkpoint", "{eagle}",
                                            "--format", "deepspec", "--out", "{tmp}/export"], {},
     "for eagle use --format eagle3"),
    ("export-mtp", "export", ["--drafter", "mtp", *TINY, "--drafter-checkpoint", "{mtp}", "--out", "{tmp}/export"],
     {}, "no engine layout holds mtp"),
    ("export-wrong-kind", "export", ["--drafter", "dspark", *TINY, "--drafter-checkpoint", "{eagle}", "--out",
                                     "{tmp}/export"], {}, "holds a eagle drafter"),
    ("export-not-a-drafter-folder", "export", ["--drafter", "dspark", *TINY, "--drafter-checkpoint", "{tmp}",
                                               "--out", "{tmp}/export"], {}, "no config.json"),
    ("export-out-exists", "export", ["--out", "{tmp}"], {}, "already exists"),
    ("export-no-out", "export", ["--drafter", "dspark"], {}, "--out"),
    ("export-unknown-format", "export", ["--format", "onnx", "--out", "{tmp}/export"], {}, "invalid choice"),
    # grade
    ("grade-timeout-inf", "grade", ["5", "--timeout", "inf"], {}, "--timeout"),
    ("grade-timeout-nan", "grade", ["5", "--timeout", "nan"], {}, "--timeout"),
    ("grade-timeout-huge", "grade", ["5", "--timeout", "1e300"], {}, "--timeout"),
    ("grade-unknown-assignment", "grade", ["9"], {}, "no assignment 9"),
    ("grade-missing-file", "grade", ["1", "/nonexistent/solution.py"], {}, "/nonexistent/solution.py"),
]  # fmt: skip


@pytest.mark.parametrize("command, argv, env, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_clear_line(command, argv, env, expected, files, monkeypatch, capsys):
    fill = lambda text: text.format(**files) if "{" in text and "}" in text else text  # noqa: E731
    for name, value in env.items():
        monkeypatch.setenv(name, fill(value))
    code = run_main(COMMANDS[command].main, [fill(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, f"exit 0 for {argv}; stderr: {err!r}"
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{err}"
    assert "Traceback" not in err
    assert fill(expected) in lines[0], f"{fill(expected)!r} not in {lines[0]!r}"


def test_a_closed_pipe_is_one_line_not_a_traceback(small_checkpoint):
    """`python -m dspark.generate ... | head -c 1`: the reader leaves early."""
    gen = subprocess.Popen(
        [sys.executable, "-m", "dspark.generate", "hello there", "--checkpoint", str(small_checkpoint), "--drafter",
         "none", "--max-new-tokens", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    gen.stdout.close()  # like `head` exiting before the reply is printed
    err = gen.stderr.read().decode()
    assert gen.wait(timeout=120) != 0
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


def test_outputs_are_written_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    """A failing write leaves neither a half-written file nor a stray temporary next to the target."""
    out = tmp_path / "a.json"
    out.write_text("old\n")

    def broken_write(self, text, encoding=None):
        raise OSError(28, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", broken_write)
    assert run_main(bench.main, ["appendix-a", "--draws", "3", "--json", str(out)]) == 2
    monkeypatch.undo()
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    assert "No space left on device" in capsys.readouterr().err


def test_marking_round_trips_on_split_multibyte_characters(tokenizer: Tokenizer, monkeypatch):
    """A UTF-8 character whose bytes are split between a drafted and a target token is never broken:
    without the «» marks the marked text is exactly the decoded text, for every split of the run."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    text = "Acum — CRL, café, 日本語, naïve ünïcödé ✓"
    ids = tokenizer.encode(text)
    plain = tokenizer.decode(ids)
    split_chars = sum(1 for i in ids if "\ufffd" in tokenizer.decode([i]))
    assert split_chars >= 4  # the case under test: several tokens hold only part of a character
    g = torch.Generator().manual_seed(0)
    patterns = [[i < k for i in range(len(ids))] for k in range(len(ids) + 1)]
    patterns += [torch.rand(len(ids), generator=g).lt(0.5).tolist() for _ in range(50)]
    for pattern in patterns:
        marked = generate_command._mark_drafted(tokenizer, ids, pattern)
        assert "\ufffd" not in marked
        assert marked.replace("«", "").replace("»", "") == plain
    shown = generate_command._mark_drafted(tokenizer, ids, [i % 2 == 0 for i in range(len(ids))])
    assert "«" in shown  # drafted runs really are marked


def test_printed_numbers_match_the_records(small_checkpoint, small_drafters, tmp_path, monkeypatch, capsys):
    """tau from `generate --json` and throughput / tokens-per-s-per-user / tau from `bench serve --json`,
    recomputed from the engine's per-request records (committed tokens only)."""
    from dspark import engine as engine_module

    runs = []
    original = engine_module.Engine.run

    def recording(self, requests, *args, **kwargs):
        result = original(self, requests, *args, **kwargs)
        runs.append(result)
        return result

    monkeypatch.setattr(engine_module.Engine, "run", recording)
    argv = ["Hello there", "a second prompt", "--json", "--checkpoint", str(small_checkpoint), "--drafter", "eagle",
            "--drafter-checkpoint", str(small_drafters["eagle"]), "--max-new-tokens", "17", "--temperature", "1"]  # fmt: skip
    assert run_main(generate.main, argv) == 0
    record = json.loads(capsys.readouterr().out)
    (run,) = runs
    committed = sum(len(r.tokens) for r in run.records) - len(
        run.records
    )  # each first token is the prefill's
    rounds = sum(len(r.rounds) for r in run.records)
    assert record["rounds"] == rounds and record["tau"] == pytest.approx(committed / rounds, abs=1e-4)
    assert sum(record["new_tokens"]) == sum(len(r.tokens) for r in run.records)

    runs.clear()
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    out = tmp_path / "serve.json"
    argv = ["serve", "--policy", "none", "--concurrency", "1", "--requests", "3", "--max-new-tokens", "6",
            "--checkpoint", str(small_checkpoint), "--json", str(out)]  # fmt: skip
    assert run_main(bench.main, argv) == 0
    (point,) = json.loads(out.read_text())["points"]
    measured = runs[-1]  # the first run is the warm-up
    tokens = sum(len(r.tokens) for r in measured.records)
    tpots = [
        (r.finished - r.first_token) / (len(r.tokens) - 1) for r in measured.records if len(r.tokens) > 1
    ]
    assert point["throughput"] == pytest.approx(tokens / measured.seconds)
    assert point["tps_per_user"] == pytest.approx(sum(1 / t for t in tpots) / len(tpots))
    assert point["tau"] == pytest.approx((tokens - 3) / sum(len(r.rounds) for r in measured.records))
    assert point["completed"] == 3 and point["rejected"] == 0


def test_the_table_covers_every_command():
    assert {c[1] for c in CASES} == set(COMMANDS)
    assert len({c[0] for c in CASES}) == len(CASES)  # unique ids


@pytest.mark.parametrize("no_color, coloured", [(None, True), ("1", False), ("", True)])
def test_no_color_turns_the_terminal_marks_into_brackets(
    tokenizer: Tokenizer, monkeypatch, no_color, coloured
):
    """On a terminal accepted drafts are green and underlined, unless NO_COLOR is set (non-empty)."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    ids = tokenizer.encode("hello world, again")
    marked = generate_command._mark_drafted(tokenizer, ids, [i % 2 == 0 for i in range(len(ids))])
    assert ("\033[" in marked) == coloured and ("«" in marked) != coloured
    assert ("\033[" in generate_command._style("x", 1)) == coloured


def test_an_unwritable_home_costs_the_cache_not_the_answer(files, monkeypatch, capsys):
    """DSPARK_HOME under a file (issue #59): `generate --policy dspark` used to measure its profile and then fail
    with a bare "Not a directory"; now it answers, measured unsaved, and says so once."""
    monkeypatch.setenv("DSPARK_HOME", files["file"] + "/x")
    monkeypatch.setattr(storage, "_unsaved", set(), raising=False)
    argv = ["hi", "--checkpoint", files["tiny"], "--drafter", "dspark", "--drafter-checkpoint", files["dspark"],
            "--policy", "dspark", "--max-new-tokens", "8", "--json"]  # fmt: skip
    assert run_main(generate.main, argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["new_tokens"] == 8
    assert captured.err.count("cannot save measurements") == 1 and "Traceback" not in captured.err
    # besides that note, only the measuring progress: its header line says what is measured and why
    assert captured.err.count("measuring this machine once") == 1
