"""`bench policies --transformers`: Hugging Face `transformers`' own `generate` on the same weights, side by side.

What a user would pick instead of this project: `model.generate(...)` greedy, and its prompt-lookup decoding
(`prompt_lookup_num_tokens`, n-gram drafts copied from the prompt and the reply so far), on the very file the
target was loaded from (a GGUF file is dequantised by `transformers` itself), at the target's dtype, in the same
process and threads. Each call is timed whole (prefill + decode), as this project's runs are.

`transformers` (with `accelerate`, which its GGUF loader needs) is a benchmark-only extra, not a runtime
dependency: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from dspark.lab.cli import UsageError

LOOKUP_TOKENS = 7  # prompt_lookup_num_tokens: as many drafts as the drafters' γ
PEERS = {"transformers generate": 0, f"transformers prompt lookup ({LOOKUP_TOKENS})": LOOKUP_TOKENS}


def load_peer(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The target's weights as `transformers` loads them (a model folder, or a GGUF file it dequantises)."""
    try:
        from transformers import AutoModelForCausalLM, logging
    except ImportError as e:
        raise UsageError(
            f"--transformers needs the benchmark extra: pip install -e '.[bench]' ({e})"
        ) from None
    logging.set_verbosity_error()  # its notes on generation settings would break the progress bar
    # use_kernels=False: plain PyTorch, as this project runs (no kernels fetched from the Hub)
    where = dict(gguf_file=path.name) if path.is_file() else {}
    folder = path.parent if path.is_file() else path
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_kernels=False, **where)
    return model.eval()


def peer_generate(
    model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos_id: int | None, lookup: int
) -> tuple[list[int], float]:
    """Greedy `generate` (prompt lookup with `lookup` > 0): the new tokens (EOS kept, as this project keeps it)
    and the seconds the call took."""
    options = dict(prompt_lookup_num_tokens=lookup) if lookup else {}
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    with torch.inference_mode():
        mask = torch.ones_like(ids)
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
            **options,
        )
    seconds = time.perf_counter() - start
    return out[0, len(prompt) :].tolist(), seconds
