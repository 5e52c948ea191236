"""The drafter-layer options of issue #42: per-head q/k RMSNorm in the parallel drafters (`qk_norm`) and
EAGLE-3's own layer in the EAGLE drafter (`eagle3_layer`). Each is the same network at training and at
inference, trains, survives a checkpoint, and old checkpoints (without the fields) load as before."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY

from dspark import train
from dspark.checkpoint import ASSETS_DIR
from dspark.drafters import load_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab.cli import run_main
from dspark.lab.training.drafters import DrafterTrainConfig, new_drafter, train_drafter, unrolled_log_probs
from dspark.lab.training.feature_cache import LiveFeatures
from dspark.training import FeatureBatch, packed_blocks


def qk_drafter(target, kind="dspark"):
    torch.manual_seed(0)
    config = ParallelDrafterConfig(kind, gamma=4, ffn_hidden=64, rank=8, mask_id=5, qk_norm=True)
    drafter = ParallelDrafter(target, config)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "q_norm" in name or "k_norm" in name or name == "head.w2.weight":
                p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return drafter.eval()


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_qk_norm_is_the_same_network_in_training_and_inference(tiny_model, kind):
    drafter = qk_drafter(tiny_model, kind)
    assert {"layers.0.attn.q_norm.weight", "layers.0.attn.k_norm.weight"} <= set(drafter.state_dict())
    tokens = torch.randint(0, TINY.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[3, 11, 25]])
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        _, u_packed = packed_blocks(drafter, out.taps, tokens, anchors, last_hidden=out.last_hidden)
        for j, a in enumerate(anchors[0].tolist()):
            drafter.reset(1)
            slot = torch.tensor([0])
            drafter.append_context(
                slot, TargetFeatures(out.taps[0, :a], out.last_hidden[0, :a]), torch.tensor([a])
            )
            _, u_inf = drafter.draft_block(slot, tokens[0, a : a + 1], drafter.config.gamma)
            torch.testing.assert_close(u_packed[0, j], u_inf[0], atol=1e-5, rtol=0)
        plain = ParallelDrafter(tiny_model, ParallelDrafterConfig(kind, 4, ffn_hidden=64, rank=8, mask_id=5))
        plain.load_state_dict({k: v for k, v in drafter.state_dict().items() if "_norm.weight" not in k or
                               "attn." not in k})  # fmt: skip
        _, u_plain = packed_blocks(plain, out.taps, tokens, anchors, last_hidden=out.last_hidden)
    assert not torch.allclose(u_plain, u_packed, atol=1e-3)  # the norm is really applied, q and k alike


def test_old_checkpoints_without_the_fields_load_as_before():
    for name in ("dspark", "eagle"):
        record = json.loads((ASSETS_DIR / f"drafter_{name}.json").read_text())["config"]
        assert "qk_norm" not in record and "eagle3_layer" not in record
        config = (ParallelDrafterConfig if name == "dspark" else AutoregressiveDrafterConfig)(**record)
        assert not getattr(config, "qk_norm", False) and not getattr(config, "eagle3_layer", False)


def test_eagle3_layer_unrolled_training_equals_inference(tiny_model):
    torch.manual_seed(0)
    drafter = new_drafter(tiny_model, "eagle", 4, ffn_hidden=64, eagle3_layer=True).eval()
    assert not hasattr(drafter, "w_in") and drafter.layers[0].attn.wq.in_features == 2 * TINY.dim
    tokens = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = tiny_model(tokens, return_taps=True)
        batch = FeatureBatch(tokens, torch.tensor([16]), torch.tensor([0]), out.taps, out.last_hidden)
        steps = unrolled_log_probs(drafter, tiny_model, batch, 3)
        i = 6  # chain i: committed positions 0..i, then the true tokens fed back with the drafter's own output
        drafter.reset(1)
        slot = torch.tensor([0])
        feats = TargetFeatures(out.taps[0, : i + 1], out.last_hidden[0, : i + 1])
        g = drafter._run(
            drafter.entries(tokens[0, 1 : i + 2], drafter.features_of(feats)), slot, torch.tensor([i + 1])
        )
        for k, (log_q, _, valid) in enumerate(steps):
            row = int(valid.flatten()[:i].sum())
            torch.testing.assert_close(log_q[row], torch.log_softmax(drafter.logits(g[-1:]).float(), -1)[0],
                                       atol=1e-4, rtol=0)  # fmt: skip
            g = drafter._run(
                drafter.entries(tokens[0, i + k + 2 : i + k + 3], g[-1:]), slot, torch.tensor([1])
            )


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
