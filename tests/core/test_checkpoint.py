"""dspark/checkpoint.py: an fp16 round trip keeps the tied weights; missing, truncated, NaN, mismatched or
other-kind checkpoints are refused in one line naming the file or tensor (with a restore hint for shipped files)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import TINY

from dspark.checkpoint import ASSETS_DIR, CheckpointError, load_target, read_checkpoint, restore_hint
from dspark.drafters import get_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.lab.storage import save_checkpoint


def test_nan_weights_are_refused_with_the_tensor_named(tmp_path, tiny_model):
    path = tmp_path / "m.safetensors"
    save_checkpoint(tiny_model, TINY, path)
    assert read_checkpoint(path)[1]  # the healthy checkpoint reads fine
    broken = type(tiny_model)(TINY)
    with torch.no_grad():
        broken.blocks[1].attn.wq.weight[0, 0] = math.nan
    save_checkpoint(broken, TINY, path)
    with pytest.raises(CheckpointError, match=r"NaN/inf weights \(in \['blocks.1.attn.wq.weight'\]\)"):
        load_target(path)


def test_a_config_that_does_not_fit_the_weights_names_one_tensor(tmp_path, tiny_model):
    path = tmp_path / "m.safetensors"
    save_checkpoint(tiny_model, TINY, path)
    twin = path.with_suffix(".json")
    twin.write_text(twin.read_text().replace('"ffn_hidden": 80', '"ffn_hidden": 96'))
    with pytest.raises(CheckpointError) as err:
        load_target(path)
    message = str(err.value)
    assert "size mismatch" in message and "\n" not in message and len(message) < 400


def test_shipped_files_get_a_restore_hint_others_do_not(tmp_path):
    assert "git checkout -- dspark/assets/drafter_dspark.safetensors" in restore_hint(
        ASSETS_DIR / "drafter_dspark.safetensors"
    )
    assert restore_hint(tmp_path / "drafter_dspark.safetensors") == ""


def test_a_checkpoint_of_another_kind_is_refused(tmp_path, tiny_model):
    eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=32))
    save_checkpoint(eagle, eagle.config, tmp_path / "e.safetensors")
    assert get_drafter("eagle", tiny_model, tmp_path / "e.safetensors").name == "eagle"
    for name in ("dspark", "mtp"):
        with pytest.raises(CheckpointError, match="holds a eagle drafter, not " + name):
            get_drafter(name, tiny_model, tmp_path / "e.safetensors")


def test_fp16_round_trip_keeps_ties(tmp_path, tiny_model):
    save_checkpoint(tiny_model, TINY, tmp_path / "m.safetensors", dtype=torch.float16, meta={"x": 1})
    model, meta = load_target(tmp_path / "m.safetensors")
    assert meta == {"x": 1}
    assert model.lm_head.weight is model.embed.weight
    for (name, a), (_, b) in zip(tiny_model.state_dict().items(), model.state_dict().items()):
        torch.testing.assert_close(a.half().float(), b, msg=name)


def test_checkpoint_errors(tmp_path, tiny_model):
    path = tmp_path / "m.safetensors"
    with pytest.raises(CheckpointError, match="not found"):
        load_target(path)
    save_checkpoint(tiny_model, TINY, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(CheckpointError, match="corrupt"):
        load_target(path)
    save_checkpoint(tiny_model, TINY, path)
    record = json.loads(path.with_suffix(".json").read_text())
    record["config"]["dim"] = 64  # weights no longer fit the config
    path.with_suffix(".json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="does not match"):
        load_target(path)
    path.with_suffix(".json").write_text("{")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_target(path)
