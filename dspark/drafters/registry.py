"""Drafters by name: building them from checkpoints for the CLIs.

Names used on every command line: `none` (plain decoding), `mtp` (MTP-1),
`eagle` (EAGLE-3 style), `dflash` (parallel drafter, no sequential head),
`dspark` (parallel + Markov head) and `dspark-rnn` (parallel + RNN head). Shipped checkpoints live in `dspark/assets/` as
`drafter_<name>.safetensors` + `.json` (fp16, only the drafter's own weights:
embedding and LM head are the target's). The JSON twin also holds the STS
temperatures a calibration run fitted for the drafter's confidence head.
`python -m dspark.train calibrate` never writes into the package: the
calibration of a shipped drafter goes under DSPARK_HOME (`calibration_path`),
that of any other drafter into its own JSON twin. `get_calibration` reads
the one under DSPARK_HOME first (when it was fitted for these very weights),
then the shipped one, checks it (one finite temperature > 0 and offset per
drafted position) and whoever schedules verify lengths passes it on
explicitly (dspark/scheduling/scheduler.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
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


def trained_for(record: dict) -> str:
    """' (trained for the target NAME)' from a drafter checkpoint's meta, '' when it does not say."""
    meta = record.get("meta")
    name = meta.get("target_checkpoint") if isinstance(meta, dict) else None
    return f" (it was trained for the target {name!r})" if name else ""


def labelled_specs(specs: list[str]) -> list[tuple[str, str]]:
    """`LABEL=CHECKPOINT` or bare shipped names (the `--drafters` of the benchmarks) -> [(label, checkpoint or
    '')]; a ValueError for an empty label or checkpoint, or a label given twice (one would replace the other)."""
    pairs, seen = [], set()
    for spec in specs:
        label, eq, path = (part.strip() for part in spec.partition("="))
        if not label:
            raise ValueError(f"--drafters: {spec!r} has no label; write LABEL=CHECKPOINT")
        if eq and not path:
            raise ValueError(f"--drafters: {spec!r} names no checkpoint after '='")
        if label in seen:
            raise ValueError(
                f"--drafters: the label {label!r} is given twice; give each drafter its own label"
            )
        seen.add(label)
        pairs.append((label, path))
    return pairs


def load_drafter(path: str | Path, target: Transformer) -> Drafter:
    """Rebuild a trained drafter for `target` from its checkpoint, on the target's device."""
    if Path(path).is_dir():  # a folder in a serving engine's layout (python -m dspark.export, DeepSpec)
        raise CheckpointError(f"{path} is a folder in a serving engine's layout: the lab reads it "
                              "(dspark.lab.exporting.exported.load_any), as every command does")  # fmt: skip
    record, tensors = read_checkpoint(path)
    config, other_target = record["config"], trained_for(record)
    if isinstance(config, dict) and "kind" not in config and "vocab_size" in config:
        raise CheckpointError(f"{path} is a target model checkpoint, not a drafter: pass it as --checkpoint, and "
                              "as --drafter-checkpoint a drafter trained for it")  # fmt: skip
    try:
        if config.get("kind") in PARALLEL_KINDS:
            drafter = ParallelDrafter(target, ParallelDrafterConfig(**config))
        else:
            drafter = AutoregressiveDrafter(target, AutoregressiveDrafterConfig(**config))
    except (AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"drafter config of {path} is invalid ({exc}){other_target}") from None
    taps = record.get("meta", {}).get("tap_layers")  # the target layers it was trained on
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


def stored_calibration(path: str | Path) -> dict | None:
    """The `calibration` record of the JSON at `path` (a drafter checkpoint's twin, or a calibration file under
    DSPARK_HOME; a .safetensors path means its twin); None when there is no such file or record."""
    twin = config_path(path)
    if not twin.is_file():
        return None
    try:
        record = json.loads(twin.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{twin} is not valid JSON ({exc})") from None
    stored = record.get("calibration") if isinstance(record, dict) else None
    if stored is not None and not isinstance(stored, dict):
        raise CheckpointError(f"{twin}: 'calibration' must be a JSON object, got {type(stored).__name__}")
    return stored


def finite_list(twin: Path, field: str, values, positive: bool) -> list[float]:
    """`values` as floats if it is a list of finite numbers (> 0 with `positive`), else a one-line error."""
    if not isinstance(values, list) or not values:
        raise CheckpointError(f"{twin}: {field} must be a non-empty list of numbers, got {values!r}")
    for k, v in enumerate(values, start=1):
        finite = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not finite or (positive and v <= 0):
            need = "finite numbers > 0" if positive else "finite numbers"
            raise CheckpointError(f"{twin}: {field} must be {need}, got {v!r} at position {k}")
    return [float(v) for v in values]


def load_calibration(path: str | Path, positions: int | None = None) -> torch.Tensor | None:
    """The STS calibration stored in the JSON at `path` (see `stored_calibration`): (γ,) temperatures, or
    (2, γ) temperatures and logit offsets (what `prefix_survival` reads); None if there is none. Checked as it
    is read: finite temperatures > 0, finite offsets, as many of each as the drafter has `positions` (when
    given) -- anything else is a `CheckpointError` naming the file."""
    stored = stored_calibration(path)
    if stored is None or stored.get("sts_temperatures") is None:
        return None
    twin = config_path(path)
    temps = finite_list(twin, "sts_temperatures", stored["sts_temperatures"], positive=True)
    shifts = stored.get("sts_shifts")
    if shifts is not None:
        shifts = finite_list(twin, "sts_shifts", shifts, positive=False)
        if len(shifts) != len(temps):
            raise CheckpointError(
                f"{twin}: sts_shifts has {len(shifts)} entries, sts_temperatures {len(temps)}"
            )
    if positions is not None and len(temps) != positions:
        raise CheckpointError(f"{twin}: the calibration has {len(temps)} positions but the drafter drafts "
                              f"{positions}; run `python -m dspark.train calibrate` for this drafter again")  # fmt: skip
    return torch.tensor(temps if shifts is None else [temps, shifts], dtype=torch.float64)


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 of a drafter's weights (of every file of an exported folder): which checkpoint a calibration under
    DSPARK_HOME was fitted for."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def calibration_path(checkpoint: str | Path, target_name: str = "tiny") -> Path:
    """Where `train calibrate` stores the calibration of the drafter at `checkpoint` (and readers look first):
    for a drafter shipped in the package, which the commands never write, DSPARK_HOME/calibration/<stem>.json
    (DSPARK_HOME/<target>/calibration/... for a named pretrained target); for any other, its JSON twin."""
    checkpoint = Path(checkpoint)
    if paths.inside_package(checkpoint):
        return paths.target_home(target_name) / "calibration" / f"{checkpoint.stem}.json"
    return config_path(checkpoint)


def drafted_positions(checkpoint: Path) -> int | None:
    """The block size a drafter checkpoint's config declares (`gamma`, or `max_gamma`), None if unreadable."""
    try:
        config = json.loads(config_path(checkpoint).read_text(encoding="utf-8"))["config"]
        positions = config.get("gamma", config.get("max_gamma"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return positions if isinstance(positions, int) and not isinstance(positions, bool) else None


def find_calibration(
    checkpoint: str | Path, target_name: str = "tiny", positions: int | None = None
) -> torch.Tensor | None:
    """The calibration of the drafter at `checkpoint`, checked for its `positions` (default: the block size of
    its config): for a shipped drafter the one under DSPARK_HOME when it was fitted for these weights (a file
    left from before the drafter was retrained is passed over), else the one shipped with it."""
    checkpoint = Path(checkpoint)
    positions = positions if positions is not None else drafted_positions(checkpoint)
    home = calibration_path(checkpoint, target_name)
    if home != config_path(checkpoint):
        stored = stored_calibration(home)
        digest = stored.get("checkpoint_sha256") if stored else None
        if stored is not None and (digest is None or digest == checkpoint_digest(checkpoint)):
            found = load_calibration(home, positions)
            if found is not None:
                return found
    return load_calibration(checkpoint, positions)


def get_drafter(
    name: str,
    target: Transformer,
    path: str | Path | None = None,
    target_name: str = "tiny",
    load: Callable[[Path, Transformer], Drafter] = load_drafter,
) -> Drafter:
    """`none`, or a trained drafter from `path` (default: the one shipped for `target_name`), read by `load`
    (the commands pass the lab's, which also reads exported folders)."""
    if name not in DRAFTER_NAMES:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)}")
    if name == "none":
        return NoDrafter(target.config.vocab_size)
    path = Path(path) if path else default_path(name, target_name)
    if not (path.is_file() or path.is_dir()):
        if target_name != "tiny" and Path(path) == default_path(name, target_name):
            raise CheckpointError(f"no {name} drafter is shipped for the target {target_name!r}; pass --drafter none "
                                  "(plain decoding) or a --drafter-checkpoint trained for it")  # fmt: skip
        raise CheckpointError(
            f"no trained {name} drafter at {path}; train one with `python -m dspark.train drafter --kind {name}`"
        )
    drafter = load(path, target)
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
    qk_norm: bool = False,
    eagle3_layer: bool = False,
) -> Drafter:
    """A freshly initialised drafter of `kind` for `target` (its SwiGLU width); MTP-1 always drafts 1 token,
    `layers` 0 = the kind's default depth, `rank` None = the default sequential-head rank, `draft_vocab` K > 0:
    it scores K target ids (the first K until `drafter.vocab.set_ids` chooses them), 0 = all; `final_hidden`:
    EAGLE and the parallel kinds read the target's final hidden state next to its tap layers; `tied_rank`: the
    Markov head's extra rank through the target's embeddings (dspark only); `ffn_hidden`: the SwiGLU width of its
    layers (0 = the target's); `qk_norm`: the parallel kinds' layers norm q and k per head (Qwen3's, what the
    serving engines load); `eagle3_layer`: EAGLE's one layer is EAGLE-3's own (drafters/eagle3_layer.py)."""
    ffn_hidden = ffn_hidden or target.config.ffn_hidden
    if kind in PARALLEL_KINDS:
        config = ParallelDrafterConfig(kind, gamma, layers or ParallelDrafterConfig.n_layers, ffn_hidden,
                                       rank=ParallelDrafterConfig.rank if rank is None else rank,
                                       mask_id=min(ParallelDrafterConfig.mask_id, target.config.vocab_size - 1),
                                       draft_vocab=draft_vocab, final_hidden=final_hidden,
                                       tied_rank=tied_rank, qk_norm=qk_norm)  # fmt: skip
        return ParallelDrafter(target, config)
    layers = layers or AutoregressiveDrafterConfig.n_layers
    config = AutoregressiveDrafterConfig(
        kind,
        1 if kind == "mtp" else gamma,
        layers,
        ffn_hidden,
        draft_vocab=draft_vocab,
        final_hidden=final_hidden and kind == "eagle",
        eagle3_layer=eagle3_layer and kind == "eagle",
    )
    return AutoregressiveDrafter(target, config)


def get_calibration(
    name: str, path: str | Path | None = None, target_name: str = "tiny", positions: int | None = None
) -> torch.Tensor | None:
    """STS temperatures of the drafter `name` at `path` (default: the one shipped for `target_name`), found
    and checked by `find_calibration`; None for `none` or a drafter never calibrated."""
    if name == "none":
        return None
    return find_calibration(Path(path) if path else default_path(name, target_name), target_name, positions)
