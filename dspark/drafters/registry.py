"""Drafters by name: building them from checkpoints for the CLIs.

Names used on every command line: `none` (plain decoding), `mtp` (MTP-1),
`eagle` (EAGLE-3 style), `dflash` (parallel drafter, no sequential head),
`dspark` (parallel + Markov head) and `dspark-rnn` (parallel + RNN head). Shipped checkpoints live in `dspark/assets/` as
`drafter_<name>.safetensors` + `.json` (fp16, only the drafter's own weights:
embedding and LM head are the target's). The JSON twin also holds the STS
temperatures a calibration run fitted for the drafter's confidence head
(`python -m dspark.train calibrate`); `get_calibration` loads them from the
same checkpoint, and whoever schedules verify lengths passes them on
explicitly (dspark/scheduling/scheduler.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark import paths
from dspark.checkpoint import CheckpointError, config_path, mismatch, read_checkpoint
from dspark.device import model_device
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter, NoDrafter
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.model import Transformer, cast_keeping_rope

DRAFTER_NAMES = ("none", "mtp", "eagle", "dflash", "dspark", "dspark-rnn")


def default_path(name: str, target_name: str = "tiny") -> Path:
    """The shipped drafter `name` for the shipped tiny target, or for a named pretrained target."""
    folder = paths.ASSETS_DIR if target_name == "tiny" else paths.ASSETS_DIR / target_name
    return folder / f"drafter_{name}.safetensors"


def load_drafter(path: str | Path, target: Transformer) -> Drafter:
    """Rebuild a trained drafter for `target` from its checkpoint, on the target's device."""
    record, tensors = read_checkpoint(path)
    try:
        if record["config"].get("kind") in PARALLEL_KINDS:
            drafter = ParallelDrafter(target, ParallelDrafterConfig(**record["config"]))
        else:
            drafter = AutoregressiveDrafter(target, AutoregressiveDrafterConfig(**record["config"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"drafter config of {path} is invalid ({exc})") from None
    taps = record.get("meta", {}).get("tap_layers")  # the target layers it was trained on
    if taps is not None and tuple(taps) != tuple(target.config.tap_layers):
        raise CheckpointError(
            f"drafter {path} was trained on target layers {list(taps)}, but this target taps "
            f"{list(target.config.tap_layers)}; with another target model pass --drafter none or a "
            "--drafter-checkpoint trained for it"
        )
    try:
        drafter.load_state_dict(tensors)
    except RuntimeError as exc:
        raise CheckpointError(
            f"drafter {path} does not fit this target ({mismatch(exc)}); with another target model pass "
            "--drafter none or a --drafter-checkpoint trained for it"
        ) from None
    drafter = drafter.to(model_device(target))  # a drafter lives where its target does, in its dtype
    return cast_keeping_rope(drafter, target.embed.weight.dtype).eval()  # a bf16 target: a bf16 drafter


def load_calibration(path: str | Path) -> torch.Tensor | None:
    """The STS calibration stored with the drafter checkpoint at `path`: (γ,) temperatures, or (2, γ)
    temperatures and logit offsets (what `prefix_survival` reads); None if it was never calibrated (or
    has no JSON twin)."""
    twin = config_path(path)
    if not twin.is_file():
        return None
    try:
        stored = json.loads(twin.read_text()).get("calibration", {})
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{twin} is not valid JSON ({exc})") from None
    temps, shifts = stored.get("sts_temperatures"), stored.get("sts_shifts")
    if temps is None:
        return None
    if shifts is not None and len(shifts) != len(temps):
        raise CheckpointError(f"{twin}: sts_shifts has {len(shifts)} entries, sts_temperatures {len(temps)}")
    return torch.tensor(temps if shifts is None else [temps, shifts], dtype=torch.float64)


def get_drafter(
    name: str, target: Transformer, path: str | Path | None = None, target_name: str = "tiny"
) -> Drafter:
    """`none`, or a trained drafter from `path` (default: the one shipped for `target_name`)."""
    if name not in DRAFTER_NAMES:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if name == "none":
        return NoDrafter(target.config.vocab_size)
    path = Path(path) if path else default_path(name, target_name)
    if not path.is_file():
        if target_name != "tiny" and Path(path) == default_path(name, target_name):
            raise CheckpointError(f"no {name} drafter is shipped for the target {target_name!r}; pass --drafter none "
                                  "(plain decoding) or a --drafter-checkpoint trained for it")  # fmt: skip
        raise CheckpointError(
            f"no trained {name} drafter at {path}; train one with `python -m dspark.train drafter --kind {name}`"
        )
    drafter = load_drafter(path, target)
    if drafter.name != name:
        raise CheckpointError(
            f"{path} holds a {drafter.name} drafter, not {name}; pass --drafter {drafter.name}"
        )
    return drafter


def new_drafter(
    target: Transformer,
    kind: str,
    gamma: int = 7,
    layers: int = 0,
    rank: int | None = None,
    draft_vocab: int = 0,
    final_hidden: bool = False,
    tied_rank: int = 0,
    ffn_hidden: int = 0,
) -> Drafter:
    """A freshly initialised drafter of `kind` for `target` (its SwiGLU width); MTP-1 always drafts 1 token,
    `layers` 0 = the kind's default depth, `rank` None = the default sequential-head rank, `draft_vocab` K > 0:
    it scores K target ids (the first K until `drafter.vocab.set_ids` chooses them), 0 = all; `final_hidden`:
    EAGLE and the parallel kinds read the target's final hidden state next to its tap layers; `tied_rank`: the
    Markov head's extra rank through the target's embeddings (dspark only); `ffn_hidden`: the SwiGLU width of its
    layers (0 = the target's)."""
    ffn_hidden = ffn_hidden or target.config.ffn_hidden
    if kind in PARALLEL_KINDS:
        config = ParallelDrafterConfig(kind, gamma, layers or ParallelDrafterConfig.n_layers, ffn_hidden,
                                       rank=ParallelDrafterConfig.rank if rank is None else rank,
                                       mask_id=min(ParallelDrafterConfig.mask_id, target.config.vocab_size - 1),
                                       draft_vocab=draft_vocab, final_hidden=final_hidden,
                                       tied_rank=tied_rank)  # fmt: skip
        return ParallelDrafter(target, config)
    layers = layers or AutoregressiveDrafterConfig.n_layers
    config = AutoregressiveDrafterConfig(
        kind,
        1 if kind == "mtp" else gamma,
        layers,
        ffn_hidden,
        draft_vocab=draft_vocab,
        final_hidden=final_hidden and kind == "eagle",
    )
    return AutoregressiveDrafter(target, config)


def get_calibration(
    name: str, path: str | Path | None = None, target_name: str = "tiny"
) -> torch.Tensor | None:
    """STS temperatures of the drafter `name` at `path` (default: the one shipped for `target_name`);
    None for `none`."""
    return (
        None if name == "none" else load_calibration(Path(path) if path else default_path(name, target_name))
    )
