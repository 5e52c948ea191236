"""Where things live on disk.

Shipped artefacts (tokenizer, default checkpoints, held-out evaluation prompts)
sit inside the package under `dspark/assets/` so a fresh clone works at once.
Everything the training commands produce (corpus, token arrays, training
runs) goes under `DSPARK_HOME` (default `~/.cache/dspark`), never into git.
"""

from __future__ import annotations

import os
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
TOKENIZER_PATH = ASSETS_DIR / "tokenizer.json"
EVAL_PROMPTS_PATH = ASSETS_DIR / "eval_prompts.jsonl"
CORPUS_MANIFEST_PATH = ASSETS_DIR / "corpus_manifest.json"  # sizes + hash of the corpus behind them
TARGET_CHECKPOINT = ASSETS_DIR / "target.safetensors"  # its config sits beside it as .json


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder, moved into place only when
    complete: an interrupted or failed write never leaves a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def dspark_home() -> Path:
    """Root for generated data and runs; override with the DSPARK_HOME variable."""
    return Path(os.environ.get("DSPARK_HOME", Path.home() / ".cache" / "dspark"))


def target_home(target_name: str = "tiny") -> Path:
    """Where data made with a target lives: DSPARK_HOME for the shipped tiny target, DSPARK_HOME/<name> for a
    named pretrained one (its responses, feature caches, runs)."""
    return dspark_home() if target_name == "tiny" else dspark_home() / target_name


def data_dir() -> Path:
    return dspark_home() / "data"


def runs_dir() -> Path:
    return dspark_home() / "runs"
