"""Throughput profiles SPS(B) for the scheduler: measured here, or modelled for a GPU.

SPS(B) is the number of target forward passes per second when one pass
carries B batch tokens (walkthrough/DESIGN.md section 5). The scheduler only ever looks it up.

  * `measure_sps`: dummy verification passes of the real target through its
    ragged KV cache -- B tokens spread over up to `requests` requests that
    each hold `context` tokens of KV -- the sizes interleaved round by round,
    median of several rounds, rolled back after each, then made monotone
    (isotonic fit) and interpolated (`ThroughputProfile.from_points`).
    `cpu_profile` caches the result under DSPARK_HOME so an engine measures it
    once.
  * `roofline_profile`: a GPU model (paper section 5.2): one pass streams the
    weights and the KV cache from HBM and does 2·P·B FLOPs; its time is the
    larger of the two plus a fixed launch overhead, optionally padded up to
    CUDA-graph bucket sizes, which makes SPS a jagged staircase.

What this file does not do: choose verify lengths (dspark/scheduling/scheduler.py).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dspark import paths
from dspark.device import cpu_description
from dspark.model import Transformer
from dspark.scheduling.scheduler import ThroughputProfile

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
    # interleaved: every round times each B once, so a spell of a busy machine slows all sizes alike
    # instead of inflating one point (the isotonic fit in `from_points` then pools what noise is left)
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


def profile_path(key: dict) -> Path:
    """Cache file of one (model config, CPU, thread count) combination."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return paths.dspark_home() / "profiles" / f"cpu-{digest}.json"


REFRESH_HINT = "python -m dspark.bench profile --refresh"


def read_profile(path: Path, key: dict, refresh: str = REFRESH_HINT) -> ThroughputProfile | None:
    """The SPS profile cached in `path` for `key` (None: none yet, or of other settings); a corrupt file is
    one line naming it and `refresh` (`paths.read_cache`)."""
    return paths.read_cache(path, key, lambda r: ThroughputProfile(r["steps_per_second"], r["name"]), refresh)


def cpu_profile(target: Transformer, refresh: bool = False, path: Path | None = None) -> ThroughputProfile:
    """The measured CPU profile of this target, measured once and cached (keyed by `cpu_profile_key` --
    DSPARK_HOME may outlive a machine; --refresh measures again)."""
    key = cpu_profile_key(target)
    path = path or profile_path(key)
    cached = None if refresh else read_profile(path, key)
    if cached is not None:
        return cached
    context = min(128, target.config.max_seq_len // 2)  # a small model gets a proportionally short context
    room = target.config.max_seq_len - context
    profile = measure_sps(target, [b for b in DEFAULT_POINTS if -(-b // 16) <= room], 16, context)
    paths.write_cache(path, {"key": key, "name": profile.name, "steps_per_second": profile.steps_per_second})
    return profile


def cpu_profile_key(target: Transformer) -> dict:
    """What a cached CPU profile depends on: the target's config, this CPU's description, the thread count,
    how it was measured (and a non-fp32 dtype)."""
    key = {
        "config": asdict(target.config),
        "threads": torch.get_num_threads(),
        "cpu": cpu_description(),
        "method": "interleaved, isotonic",
        "projection": target.speed_paths,  # how its projections compute (dspark/lab/cpu_speed.py swaps them)
    }  # (a profile measured the older way, or of the older LM-head code, is measured again)
    key["config"]["tap_layers"] = list(key["config"]["tap_layers"])
    if target.embed.weight.dtype != torch.float32:  # (only a non-fp32 dtype joins the key)
        key["dtype"] = str(target.embed.weight.dtype)
    return key


@dataclass
class RooflineConfig:
    """A dense decoder served in bf16 on one GPU (defaults: an 8 B GQA model on an H200)."""

    params: float = 8e9  # parameters read every pass
    bytes_per_param: float = 2.0  # bf16
    kv_bytes_per_token: float = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head dim x bf16
    context: int = 2048  # KV tokens each request reads per pass
    tokens_per_request: float = 4.0  # batch tokens per request (1 anchor + drafts) to count requests
    hbm_bytes_per_s: float = 4.8e12  # H200 HBM3e
    flops_per_s: float = 790e12  # achieved bf16 dense
    overhead_s: float = 2e-4  # launches, sampling, scheduling per pass
    buckets: list[int] = field(default_factory=list)  # CUDA-graph batch sizes (empty: no padding)
    max_tokens: int = 2048  # largest B in the table

    def padded(self, batch_tokens: int) -> int:
        if not self.buckets:
            return batch_tokens
        for b in sorted(self.buckets):
            if b >= batch_tokens:
                return b
        top = max(self.buckets)
        return -(-batch_tokens // top) * top

    def seconds(self, batch_tokens: int) -> float:
        B = self.padded(batch_tokens)
        requests = B / self.tokens_per_request  # fractional: the average request count
        memory = self.params * self.bytes_per_param + requests * self.context * self.kv_bytes_per_token
        return self.overhead_s + max(memory / self.hbm_bytes_per_s, 2 * self.params * B / self.flops_per_s)


def default_buckets(limit: int = 2048) -> list[int]:
    """vLLM-style capture sizes: 1, 2, 4, then every 8 up to 256, every 64 beyond."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(320, limit + 1, 64)]
    return [s for s in sizes if s <= limit]


def roofline_profile(config: RooflineConfig, name: str = "") -> ThroughputProfile:
    """SPS(B) for B = 1..max_tokens under the roofline model."""
    sps = [1.0 / config.seconds(B) for B in range(1, config.max_tokens + 1)]
    if not config.buckets:  # without padding the model is monotone already; keep the table honest anyway
        sps = [min(sps[: i + 1]) for i in range(len(sps))]
    return ThroughputProfile(sps, name or ("h200-roofline" + ("-buckets" if config.buckets else "")))


PROFILE_NAMES = ("cpu", "h200", "h200-buckets")


def named_profile(name: str, target: Transformer | None = None) -> ThroughputProfile:
    """`cpu` (measured, needs the target), `h200` (smooth roofline), `h200-buckets` (jagged)."""
    if name == "cpu":
        if target is None:
            raise ValueError("the cpu profile is measured on a target model")
        return cpu_profile(target)
    if name == "h200":
        return roofline_profile(RooflineConfig())
    if name == "h200-buckets":
        return roofline_profile(RooflineConfig(buckets=default_buckets()))
    raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
