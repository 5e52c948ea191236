"""SPS(B) profiles as the commands get them: the CPU one measured once and cached under DSPARK_HOME, and a
GPU's modelled by a roofline (paper section 5.2), by name.

  * `cpu_profile`: `measure_sps` (the core's profiler) on this machine, cached by a key of the model's
    config, this CPU and its thread count, so an engine measures it once. Only the batch sizes the caller
    needs are measured (a batch-1 `generate` needs 1..γ+1 tokens: seconds, not minutes), in SWEEPS
    independent sweeps; where they disagree by more than BUSY_SPREAD, or other processes used more than
    BUSY_CORES of the CPU meanwhile (a steady load slows every sweep alike), the machine was busy, and the
    profile serves this run but is not cached.
  * `roofline_profile`: one pass streams the weights and the KV cache from HBM and does 2·P·B FLOPs; its
    time is the larger of the two plus a fixed launch overhead, optionally padded up to CUDA-graph bucket
    sizes, which makes SPS a jagged staircase.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.lab import storage
from dspark.lab.cpu_speed import projection_method
from dspark.lab.machine import OtherLoad, cpu_description
from dspark.model import Transformer
from dspark.profiler import DEFAULT_POINTS, measure_sps, profile_from_points
from dspark.scheduler import ThroughputProfile


def profile_path(key: dict) -> Path:
    """Cache file of one (model config, CPU, thread count) combination."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return storage.dspark_home() / "profiles" / f"cpu-{digest}.json"


REFRESH_HINT = "python -m dspark.bench profile --refresh"


def profile_from_record(record: dict) -> ThroughputProfile:
    """The SPS profile a cache record holds; ValueError unless its steps/s are positive for B = 1, 2, ...
    (`storage.read_cache` turns it into one line naming the file)."""
    steps = record["steps_per_second"]
    if not steps or any(not s > 0 for s in steps):
        raise ValueError("a throughput profile needs positive steps/s for B = 1, 2, ...")
    return ThroughputProfile(steps, record["name"])


def read_profile(path: Path, key: dict, refresh: str = REFRESH_HINT) -> ThroughputProfile | None:
    """The SPS profile cached in `path` for `key` (None: none yet, or of other settings); a corrupt file is
    one line naming it and `refresh` (`storage.read_cache`)."""
    return storage.read_cache(path, key, profile_from_record, refresh)


SWEEPS = 3  # independent sweeps of every batch size; the profile takes their medians
SWEEP_REPEATS = 3  # passes per size in one sweep (their median is the sweep's)
BUSY_SPREAD = 0.25  # sweeps that differ by more than this (max / min - 1, median over sizes): a busy machine
BUSY_CORES = 0.5  # other processes using more cores than this while measuring (`OtherLoad`): a busy machine
QUICK_REQUESTS, QUICK_CONTEXT = 4, 64  # the dummy requests a sweep spreads its batch tokens over


def points_up_to(grid: list[int], largest: int) -> list[int]:
    """The sizes of `grid` below `largest`, and `largest` itself: what a measurement covering 1..largest times."""
    return sorted({n for n in grid if n < largest} | {largest})


def repeat_spread(repeats: list[list[float]]) -> float:
    """How much a measurement's repeats disagree: per size max / min - 1 over its repeats, the median over sizes."""
    return statistics.median(max(times) / min(times) - 1 for times in repeats)


def too_busy_to_cache(what: str, spread: float, others: float = 0.0) -> bool:
    """Whether a measurement was taken on a busy machine: its repeats disagree by `spread` (more than
    BUSY_SPREAD), or other processes used `others` cores meanwhile (more than BUSY_CORES); if so, one line on
    stderr (above any progress bar) says that the measurement serves this run and is not cached."""
    if spread <= BUSY_SPREAD and others <= BUSY_CORES:
        return False
    why = (
        f"repeats differ by {spread:.0%}"
        if spread > BUSY_SPREAD
        else f"other processes used {others:.1f} cores"
    )
    tqdm.write(f"note: the machine was busy while measuring {what} ({why}): this run uses the measurement, "
               "nothing is cached, and the next run measures again", file=sys.stderr)  # fmt: skip
    return True


def measure_cpu_profile(
    target: Transformer, max_tokens: int, tick: Callable[[str, int, int], None] | None = None
) -> tuple[ThroughputProfile, float]:
    """(SPS over 1..max_tokens from the medians of SWEEPS sweeps of `measure_sps`, the median over sizes of the
    relative spread of one size's sweeps); `tick(stage, done, total)` before the first sweep and after each."""
    context = min(QUICK_CONTEXT, target.config.max_seq_len // 2)  # a small model: a proportionally short one
    room = target.config.max_seq_len - context
    points = [b for b in points_up_to(DEFAULT_POINTS, max_tokens) if -(-b // QUICK_REQUESTS) <= room]
    sweeps, stage = [], f"target passes of 1-{max(points)} tokens"
    for done in range(SWEEPS + 1):
        if tick is not None:
            tick(stage, done, SWEEPS)
        if done == SWEEPS:
            break
        sweep = measure_sps(target, points, QUICK_REQUESTS, context, SWEEP_REPEATS)
        sweeps.append([1.0 / sweep.sps(b) for b in points])  # seconds per pass at each point
    seconds = [statistics.median(times) for times in zip(*sweeps)]
    spread = repeat_spread([list(times) for times in zip(*sweeps)])
    name = f"cpu-measured ({torch.get_num_threads()} threads)"
    return profile_from_points(points, seconds, max(points), name), spread


def cpu_profile(
    target: Transformer,
    refresh: bool = False,
    path: Path | None = None,
    max_tokens: int | None = None,
    tick: Callable[[str, int, int], None] | None = None,
) -> ThroughputProfile:
    """The measured CPU profile of this target, measured once and cached (keyed by `cpu_profile_key` --
    DSPARK_HOME may outlive a machine; --refresh measures again). `max_tokens`: the largest batch the caller
    needs measured (a cached profile that stops short is measured again to it; None: any cached one, else
    128); a profile measured on a busy machine is used but not cached (`measure_cpu_profile`)."""
    key = cpu_profile_key(target)
    path = path or profile_path(key)
    cached = None if refresh else read_profile(path, key)
    if cached is not None and cached.max_tokens >= (max_tokens or 1):
        return cached
    with OtherLoad() as load:
        profile, spread = measure_cpu_profile(target, max_tokens or DEFAULT_POINTS[-1], tick)
    if too_busy_to_cache("target passes", spread, load.cores):
        return profile
    storage.write_cache(
        path, {"key": key, "name": profile.name, "steps_per_second": profile.steps_per_second}
    )
    return profile


def cpu_profile_key(target: Transformer) -> dict:
    """What a cached CPU profile depends on: the target's config, this CPU's description, the thread count,
    how it was measured (and a non-fp32 dtype)."""
    key = {
        "config": asdict(target.config),
        "threads": torch.get_num_threads(),
        "cpu": cpu_description(),
        "method": "3 sweeps of 4 requests, medians, isotonic",
        "projection": projection_method(target),  # how its projections compute (cpu_speed.py swaps them)
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
