"""Checkpoints and their JSON get a plain file mode (dspark/lab/storage.py); target training learns, checkpoints and
resumes. (The checkpoint round trip and its errors: tests/core/test_checkpoint.py.)"""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest
from helpers import TINY

from dspark.checkpoint import load_target
from dspark.lab.data.corpus import DOMAINS
from dspark.lab.storage import plain_file_mode, save_checkpoint
from dspark.lab.training.target import TrainConfig, domain_counts, lr_at, train_target
from dspark.model import Transformer


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [None, 0o027])  # None: the umask the tests run under
def test_checkpoint_and_json_get_a_plain_files_mode(tmp_path, tiny_model, umask):
    """safetensors writes its file 0o600; the checkpoint gets what its JSON twin and `open()` give (issue #69)."""
    old = os.umask(umask) if umask is not None else None
    try:
        path = tmp_path / "m.safetensors"
        save_checkpoint(tiny_model, TINY, path)
        opened = tmp_path / "opened"  # the mode a file made by open() gets: 0o666 less the umask
        opened.write_text("")
        want = mode(opened)
        opened.unlink()
        assert mode(path) == mode(path.with_suffix(".json")) == plain_file_mode() == want
        assert umask is None or want == 0o640
    finally:
        if old is not None:
            os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.safetensors"]  # no temporary left


def test_a_rewritten_checkpoint_keeps_its_files_modes(tmp_path, tiny_model):
    path = tmp_path / "m.safetensors"
    save_checkpoint(tiny_model, TINY, path)
    path.chmod(0o604)
    path.with_suffix(".json").chmod(0o604)
    save_checkpoint(tiny_model, TINY, path)
    assert mode(path) == mode(path.with_suffix(".json")) == 0o604


def test_lr_schedule_and_domain_split():
    tc = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr=0.1, batch_size=7)
    assert lr_at(0, tc) == pytest.approx(0.1) and lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(100, tc) == pytest.approx(0.1)
    assert all(lr_at(s, tc) >= lr_at(s + 1, tc) for s in range(10, 100))
    counts = domain_counts(tc)
    assert sum(counts.values()) == 7 and counts["code"] == 3


@pytest.fixture()
def toy_corpus(tmp_path):
    """Token arrays where every domain repeats a short cycle: easy to learn."""
    data = tmp_path / "data"
    data.mkdir()
    for i, d in enumerate(DOMAINS):
        cycle = np.arange(10 + i, 20 + 2 * i, dtype=np.uint16)
        for split in ("train", "val"):
            np.tile(cycle, 300).tofile(data / f"{d}.{split}.bin")
    return data


def test_training_learns_checkpoints_and_resumes(tmp_path, toy_corpus):
    tc = TrainConfig(
        steps=30, batch_size=6, seq_len=32, lr=1e-2, warmup=3, eval_every=15, checkpoint_every=15
    )
    run = tmp_path / "run"
    first = train_target(TINY, tc, toy_corpus, run)
    assert first["step"] == 30
    assert all(v < 0.5 * math.log(TINY.vocab_size) for v in first["val_loss"].values())
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert len(log) == 30 and log[-1]["loss"] < log[0]["loss"]
    model, meta = load_target(run / "model.safetensors")
    assert isinstance(model, Transformer) and meta["step"] == 30

    longer = TrainConfig(**{**tc.__dict__, "steps": 34})
    second = train_target(TINY, longer, toy_corpus, run, resume=True)
    assert second["step"] == 34 and second["tokens"] == 34 * 6 * 32
    assert len((run / "log.jsonl").read_text().splitlines()) == 34
