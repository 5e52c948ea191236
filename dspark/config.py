"""Configuration of the target language model.

One dataclass, one comment per field. It is stored as JSON next to every
checkpoint, so a checkpoint can always be rebuilt from its own directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


@dataclass
class ModelConfig:
    vocab_size: int = 4096  # size of the BPE vocabulary (tokenizer.json)
    dim: int = 256  # width of the residual stream
    n_layers: int = 6  # number of transformer blocks
    n_heads: int = 8  # query heads per attention layer
    n_kv_heads: int = 2  # key/value heads (grouped-query attention: n_heads % n_kv_heads == 0)
    ffn_hidden: int = 688  # hidden width of the SwiGLU feed-forward
    max_seq_len: int = 512  # context length: RoPE table and KV-cache size
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = True  # LM head shares the token-embedding matrix
    # Layers whose outputs drafters read as context features (0-based block
    # index; the value is the residual stream after that block). Evenly spaced
    # from the first to the third-to-last, as in walkthrough/DESIGN.md section 2.
    tap_layers: tuple[int, ...] = (0, 2, 3)

    def __post_init__(self) -> None:
        self.tap_layers = tuple(self.tap_layers)
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError("dim must be divisible by n_heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be divisible by n_kv_heads")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head dimension must be even for RoPE")
        if any(not 0 <= t < self.n_layers for t in self.tap_layers):
            raise ValueError(f"tap_layers {self.tap_layers} outside 0..{self.n_layers - 1}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def drafter_layers(self, n_layers: int, ffn_hidden: int, extra_positions: int) -> ModelConfig:
        """Config of a drafter's own layers: this model's width, heads and RoPE, the
        drafter's depth and FFN width, room for `extra_positions` draft positions."""
        return replace(
            self,
            n_layers=n_layers,
            ffn_hidden=ffn_hidden,
            max_seq_len=self.max_seq_len + extra_positions,
            tap_layers=(),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields: {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
