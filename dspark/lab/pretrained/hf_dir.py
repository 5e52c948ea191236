"""Reading a Hugging Face-layout Llama directory into a `Transformer` and a `Tokenizer`.

The directory holds `config.json` (architecture "LlamaForCausalLM"), one or
more `*.safetensors` files and `tokenizer.json` (with, optionally,
`tokenizer_config.json` carrying the chat template). Tensors are renamed
onto `dspark.model.Transformer`; Hugging Face's q/k rows are already in the
rotate-half order this model uses, so nothing is permuted.

What it does not do: `.bin` (pickle) weights, sharded-index resolution
beyond "every *.safetensors file in the folder", RoPE scaling, biases.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer as HFTokenizer

from dspark.checkpoint import CheckpointError
from dspark.lab.pretrained.llama import (
    Hyperparameters,
    build_model,
    chat_format,
    check_memory,
    model_config,
    rename_hf,
)
from dspark.model import Transformer
from dspark.tokenizer import Tokenizer


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc})") from None


MISSING = object()


def hyperparameters(config: object, source: Path) -> Hyperparameters:
    """The architecture `config.json` describes, each size checked to be a JSON integer (2.7 is not truncated
    to 2), each real a finite number, `tie_word_embeddings` a boolean; anything else is one line."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{source}: config.json holds a JSON {type(config).__name__}, not an object")
    archs = config.get("architectures") or [config.get("model_type")]
    if not isinstance(archs, list) or not any(a in ("LlamaForCausalLM", "llama") for a in archs):
        raise CheckpointError(f"{source}: architecture {archs} is not supported (only LlamaForCausalLM)")
    if config.get("rope_scaling") or config.get("attention_bias") or config.get("mlp_bias"):
        raise CheckpointError(f"{source}: RoPE scaling and biases are not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: activation {config['hidden_act']!r} is not supported (only silu)")

    def field(key: str, kinds: tuple[type, ...], what: str, default: object = MISSING):
        value = config.get(key, default)
        if value is MISSING:
            raise CheckpointError(f"{source}: config.json lacks {key!r}")
        if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
            raise CheckpointError(f"{source}: config.json's {key} must be {what}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{source}: config.json's {key} must be finite, got {value!r}")
        return value

    def integer(key: str, default: object = MISSING) -> int:
        return field(key, (int,), "an integer", default)

    def real(key: str, default: float) -> float:
        return float(field(key, (int, float), "a number", default))

    heads = integer("num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    return Hyperparameters(
        vocab_size=integer("vocab_size"), dim=integer("hidden_size"), n_layers=integer("num_hidden_layers"),
        n_heads=heads, n_kv_heads=heads if kv_heads is None else integer("num_key_value_heads"),
        ffn_hidden=integer("intermediate_size"), context=integer("max_position_embeddings", 2048),
        rope_theta=real("rope_theta", 10000.0), norm_eps=real("rms_norm_eps", 1e-6),
        tied=field("tie_word_embeddings", (bool,), "true or false", False),
    )  # fmt: skip


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} holds no *.safetensors weights")
    tensors = {}
    for file in files:
        try:
            for name, tensor in load_file(str(file)).items():
                key = rename_hf(name)
                if key is None:
                    raise CheckpointError(f"{file}: tensor {name!r} is not part of a plain Llama model")
                tensors[key] = tensor
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file} is corrupt or truncated ({exc})") from None
    return tensors


def read_tokenizer(folder: Path) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json")
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as exc:  # the Rust error text
        raise CheckpointError(f"{path} is corrupt ({exc})") from None
    settings = _json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if not isinstance(settings, dict):
        raise CheckpointError(
            f"{folder / 'tokenizer_config.json'} holds a JSON {type(settings).__name__}, not an object"
        )
    specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}

    def content(key: str) -> str | None:
        value = settings.get(key)
        return value.get("content") if isinstance(value, dict) else value

    chat = chat_format(settings.get("chat_template"), specials, content("bos_token"), content("eos_token"))
    try:
        return Tokenizer(backend, chat)
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def load_hf_dir(folder: str | Path, max_seq_len: int | None = None) -> tuple[Transformer, Tokenizer]:
    """(model in fp32 and eval mode, tokenizer) from a Hugging Face-layout Llama directory."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json (not a Hugging Face model directory)")
    config = model_config(hyperparameters(_json(folder / "config.json"), folder), max_seq_len)
    check_memory(config, folder)  # before anything is read or allocated
    tokenizer = read_tokenizer(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise CheckpointError(
            f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens, the model {config.vocab_size}"
        )
    return build_model(config, read_tensors(folder), str(folder)), tokenizer
