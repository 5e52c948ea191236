"""Reading a Llama-architecture GGUF file (llama.cpp's format) into a `Transformer` and a `Tokenizer`.

What this file does: opens the file with the `gguf` package's reader (a
memory map), checks the architecture, dequantises every tensor to fp32 with
its numpy code (Q4_1, Q8_0, F16, F32 and the other types it knows), renames
the tensors onto `dspark.model.Transformer`, undoes the converter's q/k row
permutation (llama.cpp rotates interleaved pairs, this model rotates halves:
without the undo the model still runs but its perplexity on English prose is
~5x worse), and rebuilds the byte-level BPE tokenizer from the file's
metadata (vocabulary, merges, control tokens, the pre-tokenizer's name).

What it does not do: SentencePiece vocabularies, RoPE scaling, biases, other
architectures, or running llama.cpp. Anything it cannot load faithfully is
refused with one `CheckpointError` line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from dspark.checkpoint import CheckpointError
from dspark.lab.pretrained.llama import (
    Hyperparameters,
    build_model,
    chat_format,
    model_config,
    unpermute_rotary,
)
from dspark.model import Transformer
from dspark.tokenizer import Tokenizer

# GGUF tensor name (per block: after "blk.N.") -> state-dict key (after "blocks.N.")
GGUF_BLOCK_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "attn_q.weight": "attn.wq.weight",
    "attn_k.weight": "attn.wk.weight",
    "attn_v.weight": "attn.wv.weight",
    "attn_output.weight": "attn.wo.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "ffn.w_gate.weight",
    "ffn_up.weight": "ffn.w_up.weight",
    "ffn_down.weight": "ffn.w_down.weight",
}
GGUF_TOP_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight",
                  "output.weight": "lm_head.weight"}  # fmt: skip

CONTROL = 3  # tokenizer.ggml.token_type of a control (special) token

# The split before byte-level BPE, by the file's `tokenizer.ggml.pre` name.
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in (None, "default", "gpt-2", "gpt2"):
        return byte_level
    if name == "smollm":  # GPT-2's split with every digit on its own
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("llama-bpe", "llama3"):
        split = pre_tokenizers.Split(LLAMA3_SPLIT, behavior="isolated")
        return pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    raise CheckpointError(
        f"tokenizer pre-tokenizer {name!r} is not supported (known: smollm, gpt-2, llama-bpe)"
    )


class GGUFFile:
    """The parts of a GGUF file this project reads. `GGUFFile(path)` fails with one line on a bad file."""

    def __init__(self, path: str | Path) -> None:
        import gguf  # the reader; imported here so the tiny target never needs it

        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"model file not found: {self.path}")
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # truncated or not GGUF: the reader raises many kinds
            raise CheckpointError(
                f"{self.path} is not a readable GGUF file ({type(exc).__name__}: {exc})"[:300]
            ) from None
        self.fields = self.reader.fields
        self.arch = self.value("general.architecture")
        if self.arch != "llama":
            raise CheckpointError(f"{self.path}: architecture {self.arch!r} is not supported (only 'llama')")

    def value(self, key: str, default=None):
        """A metadata value (string, number, or list), or `default` when the file lacks it."""
        field = self.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception:  # a malformed field
            raise CheckpointError(f"{self.path}: metadata {key!r} is unreadable") from None

    def hyperparameters(self) -> Hyperparameters:
        a = self.arch
        required = [f"{a}.embedding_length", f"{a}.block_count", f"{a}.attention.head_count",
                    f"{a}.feed_forward_length"]  # fmt: skip
        missing = [k for k in required if k not in self.fields]
        if missing:
            raise CheckpointError(f"{self.path}: metadata lacks {missing}")
        if (
            self.value(f"{a}.rope.scaling.type", "none") not in ("none", None)
            or "rope_freqs.weight" in self._names()
        ):
            raise CheckpointError(f"{self.path}: RoPE scaling is not supported")
        tokens = self.value("tokenizer.ggml.tokens", [])
        hp = Hyperparameters(
            vocab_size=int(self.value(f"{a}.vocab_size", len(tokens))),
            dim=int(self.value(f"{a}.embedding_length")),
            n_layers=int(self.value(f"{a}.block_count")),
            n_heads=int(self.value(f"{a}.attention.head_count")),
            n_kv_heads=int(
                self.value(f"{a}.attention.head_count_kv", self.value(f"{a}.attention.head_count"))
            ),
            ffn_hidden=int(self.value(f"{a}.feed_forward_length")),
            context=int(self.value(f"{a}.context_length", 2048)),
            rope_theta=float(self.value(f"{a}.rope.freq_base", 10000.0)),
            norm_eps=float(self.value(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            tied="output.weight" not in self._names(),
        )
        rope_dims = self.value(f"{a}.rope.dimension_count")
        if rope_dims is not None and hp.n_heads and int(rope_dims) != hp.dim // hp.n_heads:
            raise CheckpointError(
                f"{self.path}: partial RoPE ({rope_dims} of {hp.dim // hp.n_heads} dims) is not supported"
            )
        return hp

    def _names(self) -> set[str]:
        return {t.name for t in self.reader.tensors}

    def tensors(self, n_heads: int, n_kv_heads: int) -> dict[str, torch.Tensor]:
        """Every tensor dequantised to fp32 under its state-dict key, q/k rows un-permuted."""
        from gguf.quants import dequantize

        out = {}
        for t in self.reader.tensors:
            key = _rename(t.name)
            if key is None:
                raise CheckpointError(f"{self.path}: tensor {t.name!r} is not part of a plain Llama model")
            try:
                array = dequantize(t.data, t.tensor_type)
            except (NotImplementedError, ValueError) as exc:
                raise CheckpointError(
                    f"{self.path}: cannot dequantise {t.name} ({t.tensor_type.name}: {exc})"
                ) from None
            shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest dimension first
            if array.size != int(np.prod(shape)):
                raise CheckpointError(f"{self.path}: tensor {t.name} holds {array.size} values, not {shape}")
            tensor = torch.from_numpy(
                np.array(array, dtype=np.float32).reshape(shape)
            )  # a copy: the map is read-only
            if key.endswith("attn.wq.weight"):
                tensor = unpermute_rotary(tensor, n_heads)
            elif key.endswith("attn.wk.weight"):
                tensor = unpermute_rotary(tensor, n_kv_heads)
            out[key] = tensor
        return out

    def tokenizer(self) -> Tokenizer:
        """The byte-level BPE tokenizer and chat format described by the metadata."""
        kind = self.value("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(
                f"{self.path}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
            )
        tokens = self.value("tokenizer.ggml.tokens")
        merges = self.value("tokenizer.ggml.merges")
        types = self.value("tokenizer.ggml.token_type", [1] * len(tokens or []))
        if not tokens or merges is None:
            raise CheckpointError(f"{self.path}: metadata lacks the tokenizer's vocabulary or merges")
        bpe = models.BPE(
            vocab={tok: i for i, tok in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges]
        )
        backend = HFTokenizer(bpe)
        backend.pre_tokenizer = _pre_tokenizer(self.value("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        specials = [tokens[i] for i, kind in enumerate(types) if kind == CONTROL]
        backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])

        def token(key: str) -> str | None:
            i = self.value(key)
            return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

        chat = chat_format(self.value("tokenizer.chat_template"), set(specials),
                           token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"))  # fmt: skip
        try:
            return Tokenizer(backend, chat)
        except ValueError as exc:
            raise CheckpointError(f"{self.path}: {exc}") from None


def _rename(name: str) -> str | None:
    if name in GGUF_TOP_NAMES:
        return GGUF_TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in GGUF_BLOCK_NAMES:
        return f"blocks.{parts[1]}.{GGUF_BLOCK_NAMES[parts[2]]}"
    return None


def load_gguf(path: str | Path, max_seq_len: int | None = None) -> tuple[Transformer, Tokenizer]:
    """(model in fp32 and eval mode, tokenizer) from a Llama GGUF file."""
    f = GGUFFile(path)
    hp = f.hyperparameters()
    config = model_config(hp, max_seq_len)
    tokenizer = f.tokenizer()
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens, the model {config.vocab_size}"
        )
    return build_model(config, f.tensors(hp.n_heads, hp.n_kv_heads), str(path)), tokenizer
