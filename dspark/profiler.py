"""SPS(B), target passes per second when one pass carries B batch tokens (DESIGN.md section 5).

`measure_sps` times dummy ragged verify passes of the real target (B tokens over up to `requests`
requests of `context` tokens each), rolled back after each; the medians are made monotone and
interpolated (`ThroughputProfile.from_points`).
"""

from __future__ import annotations

import statistics
import time

import torch

from dspark.model import Transformer
from dspark.scheduler import ThroughputProfile

DEFAULT_POINTS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]  # batch tokens measured on the CPU


@torch.no_grad()
def measure_sps(
    target: Transformer,
    batch_tokens: list[int] = DEFAULT_POINTS,
    requests: int = 16,
    context: int = 128,
    repeats: int = 5,
) -> ThroughputProfile:
    """Median seconds per ragged target pass at each B, as a profile over 1..max(B)."""
    if min(batch_tokens) < 1:
        raise ValueError("batch tokens must be >= 1")
    cfg = target.config
    if not 0 < context < cfg.max_seq_len:
        raise ValueError(f"context must be in 1..{cfg.max_seq_len - 1}")
    cache = target.new_cache(requests)
    slots = torch.tensor([cache.allocate() for _ in range(requests)])
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (requests * context,), generator=g)
    target.forward_cached(prompt, slots, torch.full((requests,), context), cache)
    shapes = []  # per B: its tokens, requests and block lengths
    for B in batch_tokens:
        r = min(B, requests)
        lens = torch.full((r,), B // r) + (torch.arange(r) < B % r)  # B tokens over r requests
        if int(lens.max()) + context > cfg.max_seq_len:
            raise ValueError(f"{B} batch tokens do not fit {requests} requests at context {context}")
        shapes.append((torch.randint(0, cfg.vocab_size, (B,), generator=g), r, lens))
    times: list[list[float]] = [[] for _ in batch_tokens]
    # interleaved: a busy spell slows every size alike instead of inflating one point
    for rep in range(repeats + 1):  # the first round is a warm-up
        for b, (tokens, r, lens) in enumerate(shapes):
            t0 = time.perf_counter()
            target.forward_cached(tokens, slots[:r], lens, cache, return_taps=True)
            if rep:
                times[b].append(time.perf_counter() - t0)
            for s in slots[:r].tolist():
                cache.rollback(s, context)
    seconds = [statistics.median(t) for t in times]
    name = f"cpu-measured ({torch.get_num_threads()} threads)"
    return ThroughputProfile.from_points(batch_tokens, seconds, max(batch_tokens), name)
