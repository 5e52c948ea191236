"""`python -m dspark.export` does no harm (issue #59): `--force` replaces only a folder the command wrote (or
an empty one), never the shipped assets or the folder holding its input; the exported README's command lines
take `--target-ref` and the folder's path as one shell word each; the deepspec layout refuses what DeepSpec
cannot load (a reduced draft vocabulary); README.md says truly which shipped drafters export."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from helpers import CONFIG, K, eagle, parallel

from dspark import export
from dspark.checkpoint import ASSETS_DIR
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab import cli
from dspark.lab.cli import run_main
from dspark.lab.exporting import folder as writer
from dspark.lab.exporting.fields import ExportInfo
from dspark.lab.pretrained.fetch import model_path
from dspark.lab.storage import save_checkpoint
from dspark.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
MARKER = {"written_by": "python -m dspark.export"}


@pytest.fixture(scope="module")
def target() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CONFIG).eval()


@pytest.fixture
def no_target(monkeypatch):
    """Loading the target fails the test: a refusal must come before any work."""

    def loaded(*args, **kwargs):
        raise RuntimeError("the target was loaded before the refusal")

    monkeypatch.setattr(cli, "load_target", loaded)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder`: (size, mtime_ns), to show nothing changed."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def drafter_args(small_checkpoint: Path, tmp_path: Path) -> list[str]:
    """A q/k-norm dspark drafter of the small target, saved as a checkpoint: what the command exports."""
    from dspark.checkpoint import load_target

    small, _ = load_target(small_checkpoint)
    torch.manual_seed(0)
    config = ParallelDrafterConfig("dspark", 3, 1, 32, rank=4, qk_norm=True)
    save_checkpoint(ParallelDrafter(small, config), config, tmp_path / "d.safetensors")
    return ["--checkpoint", str(small_checkpoint), "--drafter-checkpoint", str(tmp_path / "d.safetensors")]


# ---- 1. --force replaces only an export folder -------------------------------------------------------
def test_force_refuses_a_folder_this_command_did_not_write(tmp_path, no_target, capsys):
    thesis = tmp_path / "thesis"
    (thesis / ".git").mkdir(parents=True)
    (thesis / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (thesis / "thesis.tex").write_text("\\chapter{Four years}\n")
    (thesis / "dspark.json").write_text(json.dumps({"written_by": "me"}))  # a dspark.json, not the marker
    before = snapshot(thesis)
    assert run_main(export.main, ["--out", str(thesis), "--force"]) == 2
    err = capsys.readouterr().err
    assert "not a folder this command wrote" in err and err.count("\n") == 1
    assert snapshot(thesis) == before and [p.name for p in tmp_path.iterdir()] == ["thesis"]


def test_force_refuses_a_file(tmp_path, no_target, capsys):
    (tmp_path / "notes.txt").write_text("mine\n")
    assert run_main(export.main, ["--out", str(tmp_path / "notes.txt"), "--force"]) == 2
    assert "is a file" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine\n"


def test_force_replaces_an_earlier_export_or_an_empty_folder(small_checkpoint, tmp_path):
    argv = drafter_args(small_checkpoint, tmp_path)
    (tmp_path / "empty").mkdir()
    assert run_main(export.main, [*argv, "--out", str(tmp_path / "empty"), "--force"]) == 0
    (tmp_path / "empty" / "stale.txt").write_text("from an earlier export\n")
    again = [*argv, "--out", str(tmp_path / "empty"), "--force"]
    assert run_main(export.main, again) == 0  # now an export: it has the marker
    assert not (tmp_path / "empty" / "stale.txt").exists()
    assert json.loads((tmp_path / "empty" / "dspark.json").read_text())["written_by"] == MARKER["written_by"]


def test_export_drafter_replace_refuses_a_folder_it_did_not_write(target, tmp_path):
    """The library call guards too, not only the command line."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match="not a folder this command wrote"):
        writer.export_drafter(parallel(target, "dspark"), "deepspec", tmp_path / "mine", ExportInfo(),
                              replace=True)  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["mine"] and (tmp_path / "mine" / "data.csv").is_file()


def test_force_into_the_shipped_assets_is_refused(no_target, capsys):
    """Guards cli.refuse_clobber: `--out dspark/assets --force` never touches the shipped files."""
    before = snapshot(ASSETS_DIR)
    assert run_main(export.main, ["--out", str(ASSETS_DIR), "--force"]) == 2
    assert "inside the dspark package" in capsys.readouterr().err
    assert snapshot(ASSETS_DIR) == before


def test_force_into_the_folder_holding_the_drafter_checkpoint_is_refused(tmp_path, no_target, capsys):
    """Guards cli.refuse_clobber: even a folder marked as an export is not replaced while it holds the input."""
    folder = tmp_path / "D"
    folder.mkdir()
    for suffix in (".safetensors", ".json"):
        shutil.copy(ASSETS_DIR / f"drafter_dspark{suffix}", folder / f"x{suffix}")
    (folder / "dspark.json").write_text(json.dumps(MARKER))
    before = snapshot(folder)
    argv = ["--out", str(folder), "--force", "--drafter-checkpoint", str(folder / "x.safetensors")]
    assert run_main(export.main, argv) == 2
    assert "holds this command's input" in capsys.readouterr().err
    assert snapshot(folder) == before


# ---- 2. --target-ref and the folder's path are one shell word each -------------------------------------
REF = "my models/target; touch HACKED $(touch HACKED) `touch HACKED` 'quoted'"


def command_lines(readme: str) -> list[list[str]]:
    """The README's shell commands (its indented code lines, `\\` continuations joined), split as a shell does."""
    text = "\n".join(line[4:] for line in readme.splitlines() if line.startswith("    "))
    return [shlex.split(cmd) for cmd in text.replace("\\\n", " ").splitlines() if cmd.strip()]


@pytest.mark.parametrize("kind, fmt", [("dspark", "deepspec"), ("dflash", "speculators"), ("eagle", "eagle3"),
                                       ("eagle", "speculators")])  # fmt: skip
def test_target_ref_and_folder_are_one_shell_argument(target, tmp_path, kind, fmt):
    drafter = eagle(target) if kind == "eagle" else parallel(target, kind)
    dest = tmp_path / "out dir; touch HACKED $(id)"
    folder = writer.export_drafter(drafter, fmt, dest, ExportInfo(target_ref=REF))
    refs = dirs = 0
    for words in command_lines((folder / "README.md").read_text()):
        for word in words:
            if word.startswith("{"):  # vLLM's --speculative-config: one JSON word naming the folder
                assert json.loads(word)["model"] == str(dest)
                dirs += 1
            elif "HACKED" in word:
                assert word in (REF, str(dest)), f"{word!r} is a piece of a path, split by the shell"
                refs, dirs = refs + (word == REF), dirs + (word == str(dest))
    assert refs >= 1 and dirs >= 2


# ---- 3. deepspec: the target's whole vocabulary only ---------------------------------------------------
def test_deepspec_refuses_a_reduced_draft_vocabulary(target, tmp_path):
    with pytest.raises(ValueError, match="--format speculators") as info:
        writer.export_drafter(parallel(target, "dspark", K), "deepspec", tmp_path / "out", ExportInfo())
    assert "\n" not in str(info.value) and "vocab_size" in str(info.value) and not list(tmp_path.iterdir())


def test_each_readme_says_which_engines_load_it(target, tmp_path):
    cases = [(parallel(target, "dspark"), "deepspec", ("DeepSpec", "vLLM", "SGLang", "llama.cpp", "whole vocabulary")),
             (parallel(target, "dspark", K), "speculators", ("vLLM", "llama.cpp", "reduced draft vocabulary")),
             (eagle(target, K), "speculators", ("vLLM", "reduced draft vocabulary")),
             (eagle(target, K), "eagle3", ("vLLM", "SGLang", "reduced draft vocabulary"))]  # fmt: skip
    for n, (drafter, fmt, engines) in enumerate(cases):
        folder = writer.export_drafter(drafter, fmt, tmp_path / str(n), ExportInfo())
        readme = (folder / "README.md").read_text()
        line = next(x for x in readme.splitlines() if x.startswith("- Engines:"))
        assert all(engine in line for engine in engines), (fmt, line)


SMOLLM2 = ["--model", "smollm2-135m", "--drafter", "dspark"]


SMOLLM2_FETCHED = model_path("smollm2-135m").is_file()


@pytest.mark.skipif(not SMOLLM2_FETCHED, reason="SmolLM2-135M not fetched into DSPARK_HOME")
def test_shipped_smollm2_drafter_exports_as_speculators_not_deepspec(tmp_path, capsys):
    """Its draft vocabulary (8192 of 49152 ids): DeepSpec would size lm_head by vocab_size and refuse the
    folder, so --format deepspec is refused; --format speculators holds it with d2t/t2d."""
    assert run_main(export.main, [*SMOLLM2, "--format", "deepspec", "--out", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "--format speculators" in err and err.count("\n") == 1 and not (tmp_path / "ds").exists()
    assert run_main(export.main, [*SMOLLM2, "--format", "speculators", "--out", str(tmp_path / "sp")]) == 0
    config = json.loads((tmp_path / "sp" / "config.json").read_text())
    from safetensors.torch import load_file

    w = load_file(tmp_path / "sp" / "model.safetensors")
    assert config["transformer_layer_config"]["vocab_size"] == 49152 and config["draft_vocab_size"] == 8192
    assert w["lm_head.weight"].shape[0] == 8192 and w["t2d"].shape == (49152,) and int(w["t2d"].sum()) == 8192
    assert config["block_size"] == config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]


# ---- 4. README.md on the shipped drafters and q/k norm -------------------------------------------------
def shipped_parallel_drafters() -> dict[str, dict]:
    """'TARGET/KIND' -> the shipped parallel drafter's config (its JSON twin's)."""
    found = {}
    for path in sorted(ASSETS_DIR.glob("drafter_*.json")) + sorted(ASSETS_DIR.glob("*/drafter_*.json")):
        config = json.loads(path.read_text())["config"]
        if config["kind"] in ("dflash", "dspark", "dspark-rnn"):
            where = "tiny" if path.parent == ASSETS_DIR else path.parent.name
            found[f"{where}/{config['kind']}"] = config
    return found


def test_readme_says_which_shipped_drafters_have_qk_norm():
    section = (ROOT / "README.md").read_text().split("## Serving at scale", 1)[1].split("\n## ", 1)[0]
    text = " ".join(section.split())
    drafters = shipped_parallel_drafters()
    with_norm = sorted(k for k, c in drafters.items() if c.get("qk_norm"))
    assert "the shipped drafters predate it" not in text  # not true of all of them
    assert with_norm == ["smollm2-135m/dflash", "smollm2-135m/dspark"]  # what the README says, still true
    assert all(drafters[k].get("draft_vocab") for k in with_norm)  # reduced: speculators, not deepspec
    assert "tiny target's shipped drafters predate it" in text
    assert "SmolLM2 dflash and dspark drafters have it" in text
    assert "--format speculators" in text
