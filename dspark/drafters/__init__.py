"""Drafters: the contract (base.py: propose -> Proposal), MTP-1 and EAGLE-3 (autoregressive.py), DFlash and
DSpark (parallel.py); here, each by name (`none`, `mtp`, `eagle`, `dflash`, `dspark`, `dspark-rnn`) from its
checkpoint.

A checkpoint is `drafter_<name>.safetensors` (the drafter's own weights; embedding and LM head are the
target's) + its `.json` twin, which also holds the STS calibration of its confidence head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark.checkpoint import ASSETS_DIR, CheckpointError, config_path, mismatch, read_checkpoint
from dspark.device import model_device
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter, NoDrafter
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.model import Transformer, cast_keeping_rope

DRAFTER_NAMES = ("none", "mtp", "eagle", "dflash", "dspark", "dspark-rnn")
THE_LAB_READS_IT = "the lab reads it (dspark.lab.exporting.exported.load_any), as every command does"


def default_path(name: str, target_name: str = "tiny") -> Path:
    """The shipped drafter `name` for the shipped tiny target, or for a named pretrained target."""
    folder = ASSETS_DIR if target_name == "tiny" else ASSETS_DIR / target_name
    return folder / f"drafter_{name}.safetensors"


def trained_for(record: dict) -> str:
    """' (trained for the target NAME)' from a drafter checkpoint's meta, '' when it does not say."""
    meta = record.get("meta")
    name = meta.get("target_checkpoint") if isinstance(meta, dict) else None
    return f" (it was trained for the target {name!r})" if name else ""


def drafter_config(path: str | Path, record: dict) -> ParallelDrafterConfig | AutoregressiveDrafterConfig:
    """The drafter config a checkpoint's record holds, or a one-line `CheckpointError`."""
    config = record["config"]
    if isinstance(config, dict) and "kind" not in config and "vocab_size" in config:
        raise CheckpointError(
            f"{path} is a target model checkpoint, not a drafter: pass it as --checkpoint, and "
            "as --drafter-checkpoint a drafter trained for it"
        )
    try:
        parallel = config.get("kind") in PARALLEL_KINDS
        return (ParallelDrafterConfig if parallel else AutoregressiveDrafterConfig)(**config)
    except (AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"drafter config of {path} is invalid ({exc}){trained_for(record)}") from None


def with_weights(
    drafter: Drafter, target: Transformer, path: str | Path, record: dict, tensors: dict
) -> Drafter:
    """`drafter` holding the checkpoint's weights, on the target's device and in its dtype."""
    taps, other_target = record.get("meta", {}).get("tap_layers"), trained_for(record)  # the layers it read
    if taps is not None and tuple(taps) != tuple(target.config.tap_layers):
        raise CheckpointError(
            f"drafter {path} was trained on target layers {list(taps)}{other_target}, but this target taps "
            f"{list(target.config.tap_layers)}; with another target model pass --drafter none or a "
            "--drafter-checkpoint trained for it"
        )
    try:
        drafter.load_state_dict(tensors)
    except RuntimeError as exc:
        raise CheckpointError(
            f"drafter {path} does not fit this target ({mismatch(exc)}){other_target}; with another target "
            "model pass --drafter none or a --drafter-checkpoint trained for it"
        ) from None
    drafter = drafter.to(model_device(target))  # a drafter lives where its target does, in its dtype
    return cast_keeping_rope(drafter, target.embed.weight.dtype).eval()  # a bf16 target: a bf16 drafter


def load_drafter(path: str | Path, target: Transformer) -> Drafter:
    """Rebuild a trained drafter for `target` from its checkpoint, on the target's device."""
    if Path(path).is_dir():  # a folder in a serving engine's layout (python -m dspark.export, DeepSpec)
        raise CheckpointError(f"{path} is a folder in a serving engine's layout: {THE_LAB_READS_IT}")
    record, tensors = read_checkpoint(path)
    config = drafter_config(path, record)
    if config.draft_vocab:  # the core's drafters score the whole vocabulary
        raise CheckpointError(
            f"this drafter scores a reduced vocabulary of {config.draft_vocab} ids: {THE_LAB_READS_IT}"
        )
    try:
        parallel = isinstance(config, ParallelDrafterConfig)
        drafter = (ParallelDrafter if parallel else AutoregressiveDrafter)(target, config)
    except (AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"drafter config of {path} is invalid ({exc}){trained_for(record)}") from None
    return with_weights(drafter, target, path, record, tensors)


def drafter_path(name: str, path: str | Path | None = None, target_name: str = "tiny") -> Path:
    """`path`, or the drafter `name` shipped for `target_name`; a one-line `CheckpointError` if there is none."""
    path = Path(path) if path else default_path(name, target_name)
    if not (path.is_file() or path.is_dir()):
        if target_name != "tiny" and Path(path) == default_path(name, target_name):
            raise CheckpointError(
                f"no {name} drafter is shipped for the target {target_name!r}; pass --drafter none "
                "(plain decoding) or a --drafter-checkpoint trained for it"
            )
        raise CheckpointError(
            f"no trained {name} drafter at {path}; train one with `python -m dspark.train drafter --kind {name}`"
        )
    return path


def check_kind(drafter: Drafter, name: str, path: Path) -> Drafter:
    """`drafter` if it is the kind `name`, else a one-line `CheckpointError`."""
    if drafter.name != name:
        raise CheckpointError(
            f"{path} holds a {drafter.name} drafter, not {name}; pass --drafter {drafter.name}"
        )
    return drafter


def get_drafter(
    name: str, target: Transformer, path: str | Path | None = None, target_name: str = "tiny"
) -> Drafter:
    """`none`, or a trained drafter from `path` (default: the one shipped for `target_name`)."""
    if name not in DRAFTER_NAMES:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if name == "none":
        return NoDrafter(target.config.vocab_size)
    path = drafter_path(name, path, target_name)
    return check_kind(load_drafter(path, target), name, path)


def get_calibration(
    name: str, path: str | Path | None = None, target_name: str = "tiny", positions: int | None = None
) -> torch.Tensor | None:
    """The STS pair stored in the JSON twin of drafter `name` (at `path`, default the one shipped for
    `target_name`): (γ,) temperatures or (2, γ) temperatures and logit offsets; None for `none` or a drafter
    never calibrated. (The lab's `find_calibration` also checks every number and prefers DSPARK_HOME's.)"""
    twin = config_path(Path(path) if path else default_path(name, target_name))
    if name == "none" or not twin.is_file():
        return None
    stored = json.loads(twin.read_text(encoding="utf-8")).get("calibration") or {}
    temps, shifts = stored.get("sts_temperatures"), stored.get("sts_shifts")
    if temps is None:
        return None
    assert positions is None or len(temps) == positions, f"{twin}: calibrated for {len(temps)} positions"
    return torch.tensor(temps if shifts is None else [temps, shifts], dtype=torch.float64)
