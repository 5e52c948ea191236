"""Where the shipped files live (`dspark/assets/`, inside the package, so a fresh clone works at once), and
loading model weights: `model.safetensors` (stored fp16, loaded fp32) and its twin `model.json`,
`{"config": {...}, "meta": {...}}` (how the weights were made). Every failure is a one-line `CheckpointError`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dspark.model import ModelConfig, Transformer

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
TOKENIZER_PATH = ASSETS_DIR / "tokenizer.json"
TARGET_CHECKPOINT = ASSETS_DIR / "target.safetensors"  # its config sits beside it as .json


def config_path(weights_path: str | Path) -> Path:
    """The JSON twin of a weights file (config and meta beside `model.safetensors`: `model.json`)."""
    return Path(weights_path).with_suffix(".json")


class CheckpointError(Exception):
    """A checkpoint is missing, unreadable or does not match its config."""


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(record from the .json, floating tensors in fp32, integer ones as stored) or CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    cfg_path = config_path(path)
    if not cfg_path.is_file():
        raise CheckpointError(f"checkpoint config not found: {cfg_path}")
    try:
        record = json.loads(cfg_path.read_text())
        record["config"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint config {cfg_path} is corrupt ({exc})") from None
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({exc}){restore_hint(path)}"
        ) from None
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(f"checkpoint {path} holds NaN/inf weights (in {bad[:3]}){restore_hint(path)}")
    return record, {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def mismatch(exc: RuntimeError) -> str:
    """The first line of a `load_state_dict` error that names a tensor (not the 50-line list of all)."""
    lines = [ln.strip().rstrip(".") for ln in str(exc).splitlines()]
    named = [ln for ln in lines if ln.startswith(("size mismatch", "Missing key", "Unexpected key"))]
    return (named or lines or ["unknown"])[0][:300]


def restore_hint(path: str | Path) -> str:
    """For a shipped asset, how to get the committed file back ('' for any other path)."""
    path = Path(path).resolve()
    if path.parent == ASSETS_DIR.resolve():
        return f"; restore the shipped file with `git checkout -- dspark/assets/{path.name}`"
    return ""


def load_target(path: str | Path) -> tuple[Transformer, dict]:
    """Rebuild the target model from a checkpoint; returns (model in eval mode, meta)."""
    record, tensors = read_checkpoint(path)
    try:
        config = ModelConfig.from_dict(record["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint config of {path} is invalid ({exc})") from None
    model = Transformer(config)
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # shape mismatch
        raise CheckpointError(f"checkpoint {path} does not match its config ({mismatch(exc)})") from None
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval(), record.get("meta", {})
