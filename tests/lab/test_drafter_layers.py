"""The drafter-layer options of issue #42: per-head q/k RMSNorm in the parallel drafters (`qk_norm`) and
EAGLE-3's own layer in the EAGLE drafter (`eagle3_layer`). Each is the same network at training and at
inference (tests/core/test_parallel.py, test_autoregressive.py), trains and survives a checkpoint; old checkpoints
(without the fields) load as before (tests/core/test_drafters.py)."""

from __future__ import annotations

import pytest
import torch

from dspark import train
from dspark.drafters import load_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter
from dspark.drafters.parallel import ParallelDrafter
from dspark.lab.cli import run_main
from dspark.lab.training.drafters import DrafterTrainConfig, new_drafter, train_drafter
from dspark.lab.training.feature_cache import LiveFeatures


@pytest.mark.parametrize("kind", ["dspark", "eagle"])
def test_both_options_train_and_survive_a_checkpoint(tiny_model, tmp_path, kind):
    records = [{"domain": "code", "split": "train", "prompt_ids": [1, 2, 3],
                "response_ids": torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(s)).tolist()}
               for s in range(6)]  # fmt: skip
    torch.manual_seed(0)
    drafter = new_drafter(
        tiny_model, kind, 3, ffn_hidden=64, qk_norm=kind == "dspark", eagle3_layer=kind == "eagle"
    )
    norm = "layers.0.attn.q_norm.weight" if kind == "dspark" else "layers.0.attn.wq.weight"
    before = drafter.state_dict()[norm].clone()
    tc = DrafterTrainConfig(steps=3, batch_size=3, unroll=3, eval_every=3, eval_sequences=3, bf16=False)
    data = LiveFeatures(tiny_model, records)
    train_drafter(drafter, tiny_model, data, data, tc, tmp_path / "d.safetensors", {"tap_layers": [0, 1]})
    assert not torch.equal(before, drafter.state_dict()[norm])  # it trains
    back = load_drafter(tmp_path / "d.safetensors", tiny_model)
    assert getattr(back.config, "qk_norm" if kind == "dspark" else "eagle3_layer") is True
    assert isinstance(back, ParallelDrafter if kind == "dspark" else AutoregressiveDrafter)


@pytest.mark.parametrize("argv, expected", [
    (["drafter", "--kind", "eagle", "--qk-norm"], "--qk-norm is for the parallel kinds"),
    (["drafter", "--kind", "dspark", "--eagle3-layer"], "--eagle3-layer is one layer of the eagle kind"),
    (["drafter", "--kind", "eagle", "--eagle3-layer", "--layers", "2"], "--eagle3-layer"),
])  # fmt: skip
def test_the_train_options_refuse_the_wrong_kind_in_one_line(argv, expected, capsys):
    assert run_main(train.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
