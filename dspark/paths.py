"""Where the shipped artefacts live: `dspark/assets/`, inside the package, so a fresh clone works at once."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
TOKENIZER_PATH = ASSETS_DIR / "tokenizer.json"
EVAL_PROMPTS_PATH = ASSETS_DIR / "eval_prompts.jsonl"
CORPUS_MANIFEST_PATH = ASSETS_DIR / "corpus_manifest.json"  # sizes + hash of the corpus behind them
TARGET_CHECKPOINT = ASSETS_DIR / "target.safetensors"  # its config sits beside it as .json


def config_path(weights_path: str | Path) -> Path:
    """The JSON twin of a weights file (config and meta beside `model.safetensors`: `model.json`)."""
    return Path(weights_path).with_suffix(".json")
