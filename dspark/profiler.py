"""SPS(B), target passes per second when one pass carries B batch tokens (DESIGN.md section 5).

`measure_sps` times dummy ragged verify passes of the real target (B tokens over up to `requests`
requests of `context` tokens each), rolled back after each; the medians are made monotone and
interpolated (`profile_from_points`).
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
    """Median seconds per ragged target pass at each B >= 1, as a profile over 1..max(B); `context` plus
    the longest block must fit the target's context."""
    cfg = target.config
    cache = target.new_cache(requests)
    slots = torch.tensor([cache.allocate() for _ in range(requests)])
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (requests * context,), generator=g)
    target.forward_cached(prompt, slots, torch.full((requests,), context), cache)
    shapes = []  # per B: its tokens, requests and block lengths
    for B in batch_tokens:
        r = min(B, requests)
        lens = torch.full((r,), B // r) + (torch.arange(r) < B % r)  # B tokens over r requests
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
    return profile_from_points(batch_tokens, seconds, max(batch_tokens), name)


def profile_from_points(
    batch_tokens: list[int], seconds_per_step: list[float], max_tokens: int, name: str = ""
) -> ThroughputProfile:
    """SPS over B = 1..max_tokens from step times measured at some B (`interpolated_times`)."""
    return ThroughputProfile(
        [1.0 / t for t in interpolated_times(batch_tokens, seconds_per_step, max_tokens)], name
    )


def isotonic_fit(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run, means non-decreasing
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def interpolated_times(sizes: list[int], seconds: list[float], max_size: int) -> list[float]:
    """Times measured at some sizes -> a time for every size 1..max_size: made non-decreasing (more work is
    never faster), then linear between points, flat before the first, proportional after the last."""
    points = sorted(zip(sizes, seconds))
    xs, ys = [float(b) for b, _ in points], isotonic_fit([t for _, t in points])
    times = []
    for B in range(1, max_size + 1):
        if B <= xs[0]:
            t = ys[0]
        elif B >= xs[-1]:
            t = ys[-1] * B / xs[-1]
        else:
            i = next(i for i in range(1, len(xs)) if xs[i] >= B)
            w = (B - xs[i - 1]) / (xs[i] - xs[i - 1])
            t = ys[i - 1] + w * (ys[i] - ys[i - 1])
        times.append(t)
    return times
