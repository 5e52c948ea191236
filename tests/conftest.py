"""Shared fixtures: a tiny randomly initialised target (fast, fp32) and the shipped tokenizer."""

from __future__ import annotations

import os

# Triton kernels run on CPU only in the interpreter, which is chosen when a kernel module is
# imported: set it before anything imports `kernels.*` (tests/test_kernel_*.py).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch

from dspark import paths
from dspark.config import ModelConfig
from dspark.data.tokenizer import Tokenizer
from dspark.model import Transformer

TINY = ModelConfig(
    vocab_size=97,  # not a power of two on purpose
    dim=48,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    ffn_hidden=80,
    max_seq_len=64,
    tap_layers=(0, 1),
)


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(TINY).eval()


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(paths.TOKENIZER_PATH)
