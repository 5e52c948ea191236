"""Plain autoregressive generation for a batch of prompts: the tokens every speculative path must
reproduce at temperature 0. One ragged prefill pass, then one token per unfinished request per step, until
EOS (kept), `max_new_tokens` or a full context. Each step reads the host twice: the sampled tokens, and the
forward pass's ragged index.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import torch

from dspark.device import model_device, to_host, upload
from dspark.kv_cache import KVCache
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per prompt (EOS included when it ended the request)
    stop_reasons: list[str]  # per prompt: "eos", "length" (max_new_tokens) or "context"
    prefill_seconds: float  # wall time of the prefill pass
    decode_seconds: float  # wall time of all decode steps
    steps: int  # target forward passes after prefill

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_seconds + self.decode_seconds
        return self.new_tokens / total if total > 0 else float("nan")


def is_integer(value: object) -> bool:
    """A Python or NumPy integer, not a bool (True is an int to Python, never a token id or a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_token_ids(ids: list[int], vocab_size: int | None, what: str) -> None:
    """Raise ValueError unless every id of `ids` (host ints) is an integer in 0..vocab_size-1 (`what` names
    the list, e.g. "prompt 2"); torch would truncate a float or raise a bare IndexError."""
    for j, t in enumerate(ids, start=1):
        if not is_integer(t):
            raise ValueError(f"{what}: token {j} is {t!r}, not an integer token id")
    if ids and vocab_size is not None and not (0 <= min(ids) and max(ids) < vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(f"{what}: token id {bad} is outside the vocabulary 0..{vocab_size - 1}")


def check_max_new_tokens(max_new_tokens: object) -> None:
    """Raise ValueError unless the budget is an integer >= 1 (4.5 or True is refused, not rounded)."""
    if not is_integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_prompts(
    prompts: list[list[int]], context: int, vocab_size: int | None = None, names: list[str] | None = None
) -> None:
    """Raise ValueError for no prompts, an empty prompt, one with no room to generate, or (with `vocab_size`)
    a bad id. Prompts are numbered from 1, or called by `names` (e.g. "FILE line 3")."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("no prompts given" if not prompts else "prompts must be a list of token-id lists")
    for i, p in enumerate(prompts, start=1):
        name = names[i - 1] if names else f"prompt {i}"
        if not isinstance(p, (list, tuple)):
            raise ValueError(f"{name} is a {type(p).__name__}, not a list of token ids")
        if len(p) == 0:
            raise ValueError(f"{name} is empty")
        if len(p) >= context:
            raise ValueError(
                f"{name} is {len(p)} tokens; the model's context is {context} tokens "
                "and generation needs room for at least one more"
            )
        check_token_ids(p, vocab_size, name)


def stop_reason(
    emitted: list[int], eos_id: int | None, max_new_tokens: int, length: int, context: int
) -> str:
    """Why a request stops after its latest token: "eos", "length", "context" (no room for it), "" (go on)."""
    if eos_id is not None and emitted[-1] == eos_id:
        return "eos"
    if len(emitted) >= max_new_tokens:
        return "length"
    return "context" if length + 1 > context else ""


@torch.no_grad()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    cache: KVCache | None = None,
) -> GenerationResult:
    """Generate for every prompt; `eos_id=None` never stops early (benchmarks)."""
    check_max_new_tokens(max_new_tokens)
    context = model.config.max_seq_len
    check_prompts(prompts, context, model.config.vocab_size)
    generator = generator or torch.Generator().manual_seed(0)
    cache = cache or model.new_cache(len(prompts))
    device = model_device(model)
    slot_list = [cache.allocate() for _ in prompts]
    slots = upload(slot_list, device)  # (S,)
    try:
        t0 = time.perf_counter()
        lengths = [len(p) for p in prompts]  # each request's cache length, kept on the host
        flat = upload([t for p in prompts for t in p], device)  # (ΣT,) every prompt, one ragged pass
        logits = model.forward_cached(flat, slots, upload(lengths, device), cache, last_only=True).logits
        next_tokens = sample(probabilities(logits, params), generator, check=False)  # (S,)
        prefill_seconds = time.perf_counter() - t0
        out, reasons, active = [[] for _ in prompts], [""] * len(prompts), list(range(len(prompts)))
        steps, t1 = 0, time.perf_counter()
        while True:
            tokens = to_host(next_tokens, "decoding: next tokens")  # host sync: emit them, check the stops
            still = []
            for row, i in enumerate(active):
                out[i].append(tokens[row])
                reasons[i] = stop_reason(out[i], eos_id, max_new_tokens, lengths[i], context)
                if not reasons[i]:  # its token goes into the cache next
                    still.append((row, i))
                    lengths[i] += 1
            if not still:
                break
            active = [i for _, i in still]
            feed = next_tokens[upload([row for row, _ in still], device)]  # (S',) the unfinished rows' tokens
            step_slots = upload([slot_list[i] for i in active], device)
            logits = model.forward_cached(feed, step_slots, torch.ones_like(step_slots), cache).logits
            next_tokens = sample(probabilities(logits, params), generator, check=False)
            steps += 1
        decode_seconds = time.perf_counter() - t1
    finally:
        for s in slot_list:
            cache.free(s)
    return GenerationResult(out, reasons, prefill_seconds, decode_seconds, steps)
