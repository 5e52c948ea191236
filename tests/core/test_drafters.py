"""dspark/drafters/__init__.py: loading drafters and their STS calibration (shipped files, checkpoint JSON,
one-line refusals of bad files and configs) and the shipped drafters' greedy identity."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import GREEDY, make

from dspark.checkpoint import ASSETS_DIR, CheckpointError
from dspark.decoding import generate
from dspark.drafters import get_calibration, load_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafterConfig
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.engine import speculative_generate
from dspark.lab import calibration as lab_calibration
from dspark.lab.storage import save_checkpoint


@pytest.mark.parametrize(
    "name, gamma", [("mtp", 1), ("eagle", 7), ("eagle", 3), ("dflash", 7), ("dspark", 7), ("dspark", 2)]
)
def test_shipped_drafters_are_greedy_identical(name, gamma, tokenizer):
    from dspark.checkpoint import TARGET_CHECKPOINT, load_target
    from dspark.drafters import default_path, get_drafter
    from dspark.lab.data.corpus import EVAL_PROMPTS_PATH, load_eval_prompts

    if not (TARGET_CHECKPOINT.is_file() and default_path(name).is_file()):
        pytest.skip(f"no shipped {name} drafter")
    target, _ = load_target(TARGET_CHECKPOINT)
    records = load_eval_prompts(EVAL_PROMPTS_PATH)
    ps = [tokenizer.chat_prompt(r["prompt"]) for r in records[::80]]  # one prompt per domain, ragged lengths
    reference = generate(target, ps, 40, GREEDY, eos_id=tokenizer.eos_id)
    result = speculative_generate(
        target, get_drafter(name, target), ps, 40, GREEDY, gamma, eos_id=tokenizer.eos_id
    )
    assert result.tokens == reference.tokens
    assert result.stats.tau > 1.2  # a trained drafter really gets tokens accepted


def test_a_checkpoint_naming_an_option_dspark_no_longer_has_is_refused_in_one_line(tiny_model, tmp_path):
    """Three options left the drafters (normed_head_input, final_hidden, tied_rank; the shipped JSONs no longer
    name them): a checkpoint that still names one is refused in one line naming it, not half-loaded."""
    drafter = make(tiny_model, "dspark")
    path = tmp_path / "d.safetensors"
    save_checkpoint(drafter, drafter.config, path)
    record = json.loads(path.with_suffix(".json").read_text())
    for key in ("normed_head_input", "final_hidden", "tied_rank"):
        path.with_suffix(".json").write_text(json.dumps(record | {"config": record["config"] | {key: 0}}))
        with pytest.raises(CheckpointError, match=f"drafter config of .* is invalid .*{key}"):
            load_drafter(path, tiny_model)
    path.with_suffix(".json").write_text(json.dumps(record))
    loaded = load_drafter(path, tiny_model)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), drafter.state_dict().values()))


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


def test_temperatures_live_in_the_checkpoint_json(tmp_path):
    weights = tmp_path / "d.safetensors"
    weights.with_suffix(".json").write_text(json.dumps({"config": {}}))
    assert get_calibration("dspark", weights) is None
    lab_calibration.save_temperatures(weights, torch.tensor([1.5, 2.0]), {"rounds": 10})
    assert get_calibration("dspark", weights).tolist() == [1.5, 2.0]
    assert json.loads(weights.with_suffix(".json").read_text())["calibration"]["rounds"] == 10
    # with logit offsets: stored next to the temperatures, read back as the (2, γ) prefix_survival takes
    lab_calibration.save_temperatures(weights, torch.tensor([[1.5, 2.0], [0.25, -0.5]]), {"rounds": 10})
    assert get_calibration("dspark", weights).tolist() == [[1.5, 2.0], [0.25, -0.5]]
    assert get_calibration("dspark", weights, positions=2).dtype == torch.float64
    # the lab's reader, which also checks every number, reads the same pair
    assert lab_calibration.load_calibration(weights).tolist() == [[1.5, 2.0], [0.25, -0.5]]
    assert lab_calibration.describe_sts(get_calibration("dspark", weights)) == "T 1.50 2.00; b +0.25 -0.50"


def test_shipped_calibration_is_loaded_with_the_drafter_checkpoint(tmp_path):
    temps = get_calibration("dspark")
    assert temps is not None and temps.dtype == torch.float64 and temps.shape == (2, 7)  # T_k; b_k
    assert get_calibration("none") is None
    assert get_calibration("dspark", tmp_path / "nothing.safetensors") is None


def test_old_checkpoints_without_the_fields_load_as_before():
    for name in ("dspark", "eagle"):
        record = json.loads((ASSETS_DIR / f"drafter_{name}.json").read_text())["config"]
        assert "qk_norm" not in record and "eagle3_layer" not in record
        config = (ParallelDrafterConfig if name == "dspark" else AutoregressiveDrafterConfig)(**record)
        assert not getattr(config, "qk_norm", False) and not getattr(config, "eagle3_layer", False)
