"""Bad values are refused where they enter the library, with a message that names them:
configs, sampling parameters, checkpoints (NaN weights, wrong kind, truncated shipped files)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY

from dspark.checkpoint import ASSETS_DIR, CheckpointError, load_target, read_checkpoint, restore_hint
from dspark.drafters import get_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.lab.storage import save_checkpoint
from dspark.model import ModelConfig
from dspark.sampling import SamplingParams


@pytest.mark.parametrize("field", ["vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden",
                                   "max_seq_len"])  # fmt: skip
@pytest.mark.parametrize("value", [0, -1])
def test_model_config_needs_positive_sizes(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{field: value})


def test_model_config_needs_positive_finite_rope_and_eps():
    for field in ("rope_theta", "norm_eps"):
        for value in (0.0, -1.0, math.inf, math.nan):
            with pytest.raises(ValueError, match=field):
                ModelConfig(**{field: value})


@pytest.mark.parametrize("temperature", [math.inf, math.nan, -0.5, 1e-39, 1e-7])
def test_temperatures_that_are_not_usable_are_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature)


def test_usable_temperatures_pass():
    for t in (0.0, 1e-6, 0.7, 1.0, 1e6):
        assert SamplingParams(t).temperature == t


@pytest.mark.parametrize("config, field", [
    (lambda: ParallelDrafterConfig("dspark", n_layers=0), "n_layers"),
    (lambda: ParallelDrafterConfig("dspark", n_layers=-1), "n_layers"),
    (lambda: ParallelDrafterConfig("dspark", ffn_hidden=0), "ffn_hidden"),
    (lambda: ParallelDrafterConfig("dspark", gamma=0), "gamma"),
    (lambda: AutoregressiveDrafterConfig("eagle", 0), "max_gamma"),
    (lambda: AutoregressiveDrafterConfig("eagle", 3, n_layers=-1), "n_layers"),
])  # fmt: skip
def test_drafter_configs_refuse_empty_shapes(config, field):
    with pytest.raises(ValueError, match=field):
        config()


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
