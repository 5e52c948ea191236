"""What one drafting pass costs: the other half of a speculative step's time, next to SPS(B).

Algorithm 1 (dspark/scheduler.py) prices a step by its target pass,
1 / SPS(B). Every step that drafts also pays a drafting pass, whatever it then
verifies. On a GPU that is a small fraction of the step (the paper ignores it);
on this CPU a DSpark drafting pass costs about as much as a target pass, so a
scheduler that leaves it out drafts when drafting does not pay.

`DraftCost` is the time of one drafting pass as a function of how many requests
draft in it, for the block size γ the engine uses -- and, where it depends on
it, of the block's width w <= γ: a parallel drafter's pass runs n·w block
tokens through its layers, head and sequential stage, which on a CPU costs
about in proportion (SmolLM2 fp32, 16 requests: 52 / 43 / 25 ms at w = 7 / 4 /
2), so a step that will verify one or two drafts per request need not draft
seven. The table holds n requests at w = γ and at w = 1; widths between are
interpolated linearly (the roofline is convex in the tokens, so this
over-prices them a little, never under):

  * `measure_draft_cost`: real `propose` calls of the drafter on a prefilled
    context, one new committed token per request per call (the steady state),
    median of several, at a few request counts, and the cost per extra context
    token a request brings after idling (it catches up in its next pass); `cpu_draft_cost` caches it
    under DSPARK_HOME keyed like the SPS profile (target config, drafter
    config, γ, threads) and measures again on `refresh`.
  * `roofline_draft_cost`: the same for a modelled GPU (the SPS roofline of
    dspark/profiler.py with the drafter's parameter count): a
    parallel drafter is one pass over n·γ block tokens, a chain drafter γ
    passes over n tokens.

What this file does not do: decide anything (dspark/lab/cost_aware/scheduler.py), or time a whole engine step
(dspark/lab/step_cost.py).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from dspark.drafters.base import Drafter, TargetFeatures
from dspark.lab import storage
from dspark.lab.cpu_speed import projection_method
from dspark.lab.machine import OtherLoad, cpu_description
from dspark.lab.profiles import RooflineConfig, too_busy_to_cache
from dspark.model import Transformer
from dspark.profiler import interpolated_times
from dspark.sampling import SamplingParams
from dspark.scheduler import ThroughputProfile

DRAFT_POINTS = [1, 2, 4, 8, 16, 32]  # drafting requests measured on the CPU
CATCH_UP_TOKENS = 16  # extra context tokens per request when measuring the cost of catching up


@dataclass
class DraftCost:
    """Seconds of one drafting pass with n drafting requests, n = 1..len(seconds_by_requests)."""

    seconds_by_requests: list[float]  # entry n-1: seconds when n requests draft, one new context token each
    name: str = ""  # where it came from ("cpu-measured dspark", "h200-roofline", "free", ...)
    # seconds per context token beyond one per request that the pass must first append: a request that
    # idled for s steps brings s more committed tokens to its next drafting pass
    seconds_per_token: float = 0.0
    # entry n-1: seconds when n requests draft ONE position each (a block of width 1); None: the pass costs
    # the same whatever the width (a chain drafter of γ = 1, or a cost measured at γ only)
    one_position: list[float] | None = None
    block: int = 0  # γ, the width `seconds_by_requests` was measured at (needed with `one_position`)
    # how much the measurement's repeats disagreed (`profiles.repeat_spread`; a busy machine: not cached); not stored
    spread: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        if not self.seconds_by_requests or any(not s >= 0 for s in self.seconds_by_requests):
            raise ValueError("a drafting cost needs non-negative seconds for n = 1, 2, ...")
        if not self.seconds_per_token >= 0:
            raise ValueError("seconds_per_token must be >= 0")
        if self.one_position is not None:
            if len(self.one_position) != len(self.seconds_by_requests) or any(
                not s >= 0 for s in self.one_position
            ):
                raise ValueError(
                    "one_position needs non-negative seconds for the same n as seconds_by_requests"
                )
            if self.block < 2:
                raise ValueError("a width-dependent cost needs the full block's width γ >= 2")

    @property
    def width_matters(self) -> bool:
        """Does a narrower block cost less (so the scheduler should choose the width)?"""
        return self.one_position is not None

    @classmethod
    def free(cls) -> DraftCost:
        """No drafting cost: the scheduler then behaves exactly as the paper's Algorithm 1."""
        return cls([0.0], "free")

    @property
    def is_free(self) -> bool:
        return not any(self.seconds_by_requests) and not self.seconds_per_token

    def seconds(self, requests: int, width: int | None = None) -> float:
        """T_draft(n, w): n requests draft a block of `width` positions (None: the full block); 0 when
        nobody drafts; beyond the table, proportionally longer; widths between 1 and γ interpolated."""
        if requests <= 0:
            return 0.0
        full = lookup(self.seconds_by_requests, requests)
        if width is None or self.one_position is None or width >= self.block:
            return full
        one = lookup(self.one_position, requests)
        return one + (full - one) * (max(1, width) - 1) / (self.block - 1)

    @classmethod
    def from_points(
        cls,
        requests: list[int],
        seconds: list[float],
        max_requests: int,
        name: str = "",
        per_token: float = 0.0,
        one_position: list[float] | None = None,
        block: int = 0,
    ) -> DraftCost:
        """Interpolate measured times linearly over n = 1..max_requests (flat before the first point,
        proportional after the last), after an isotonic fit: more drafting requests never cost less.
        `one_position`: the same points measured at width 1 (a block of γ = `block` otherwise), fitted alike
        and capped by the full block's time (a narrower block never costs more)."""
        full = interpolated_times(requests, seconds, max_requests)
        one = None
        if one_position is not None:
            one = [min(a, b) for a, b in zip(interpolated_times(requests, one_position, max_requests), full)]
        return cls(full, name, per_token, one, block if one is not None else 0)


def lookup(table: list[float], requests: int) -> float:
    """Entry n-1 of a per-request-count table; beyond it, proportionally longer."""
    if requests <= len(table):
        return table[requests - 1]
    return table[-1] * requests / len(table)


@torch.no_grad()
def measure_draft_cost(
    target: Transformer,
    drafter: Drafter,
    gamma: int,
    requests: list[int] = DRAFT_POINTS,
    context: int = 64,
    repeats: int = 5,
) -> DraftCost:
    """Median seconds of `drafter.propose` at each drafting-request count (resets the drafter)."""
    cfg = target.config
    n_max = max(requests)
    g = torch.Generator().manual_seed(0)
    cache = target.new_cache(n_max)
    slots = torch.tensor([cache.allocate() for _ in range(n_max)])
    prompt = torch.randint(0, cfg.vocab_size, (n_max * context,), generator=g)
    lens = torch.full((n_max,), context)
    out = target.forward_cached(prompt, slots, lens, cache, return_taps=True)
    params = SamplingParams(1.0)
    drafter.reset(n_max)
    anchors = torch.randint(0, cfg.vocab_size, (n_max,), generator=g)
    drafter.propose(slots, prompt, TargetFeatures(out.taps, out.last_hidden), lens, anchors, gamma, params, g)
    seconds = []
    for n in requests:
        one = torch.ones(n, dtype=torch.long)
        times = []
        for rep in range(repeats + 1):  # the first call is a warm-up
            feats = TargetFeatures(out.taps[:n], out.last_hidden[:n])  # one new committed token each
            t0 = time.perf_counter()
            drafter.propose(slots[:n], anchors[:n], feats, one, anchors[:n], gamma, params, g)
            if rep:
                times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    # catching up: n requests bring `extra` more context tokens each (they idled); the slope per token
    cost = DraftCost.from_points(requests, seconds, n_max)
    drafter.reset(n_max)
    drafter.propose(slots, prompt, TargetFeatures(out.taps, out.last_hidden), lens, anchors, gamma, params, g)
    n = min(4, n_max)
    room = (cfg.max_seq_len - context - gamma - 2) // (repeats + 1)  # context left for every call's tokens
    extra = min(CATCH_UP_TOKENS, room - 1, len(prompt) // n - 1)
    catch_up = []
    for rep in range(repeats + 1 if extra > 0 else 0):
        rows = slice(0, n * (1 + extra))
        new = torch.full((n,), 1 + extra, dtype=torch.long)
        t0 = time.perf_counter()
        drafter.propose(slots[:n], prompt[rows], TargetFeatures(out.taps[rows], out.last_hidden[rows]), new,
                        anchors[:n], gamma, params, g)  # fmt: skip
        if rep:
            catch_up.append(time.perf_counter() - t0)
    per_token = max(0.0, (statistics.median(catch_up) - cost.seconds(n)) / (n * extra)) if catch_up else 0.0
    drafter.reset(n_max)  # forget the dummy context
    name = f"cpu-measured {drafter.name} γ={gamma} ({torch.get_num_threads()} threads)"
    return replace(cost, name=name, seconds_per_token=per_token)


def draft_cost_path(key: dict) -> Path:
    """Cache file of one (target, drafter, γ, CPU, threads) combination."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return storage.dspark_home() / "profiles" / f"draft-{digest}.json"


def draft_cost_key(target: Transformer, drafter: Drafter, gamma: int) -> dict:
    """What a cached drafting cost depends on: target and drafter configs, γ, this CPU, threads (and a
    non-fp32 dtype)."""
    config = asdict(target.config) | {"tap_layers": list(target.config.tap_layers)}
    key = {
        "target": config,
        "drafter": drafter.config.to_dict(),
        "gamma": gamma,
        "threads": torch.get_num_threads(),
        "cpu": cpu_description(),
        "projection": projection_method(target),  # how the heads compute (their cost)
    }
    if target.embed.weight.dtype != torch.float32:  # (only a non-fp32 dtype joins the key)
        key["dtype"] = str(target.embed.weight.dtype)
    return key


REFRESH_HINT = "python -m dspark.bench profile --refresh --drafters NAME"


def draft_cost_of(record: dict) -> DraftCost | None:
    """A cached record as a `DraftCost`; None for a file of before the catch-up cost (measured again)."""
    if "seconds_per_token" not in record:
        return None
    return DraftCost(record["seconds_by_requests"], record["name"], record["seconds_per_token"],
                     record.get("one_position"), record.get("block", 0))  # fmt: skip


def cached_draft_cost(
    key: dict, measure: Callable[[], DraftCost], refresh: bool = False, requests: int = 1, what: str = ""
) -> DraftCost:
    """The cost cached under `key` (DSPARK_HOME/profiles) if it covers `requests` drafting requests, else (or
    on `refresh`) `measure()`, stored unless the machine was busy (`too_busy_to_cache`: its repeats disagree,
    or other processes used the CPU meanwhile; said on stderr, naming `what`, and used for this run only). A
    corrupt file is one line naming it and --refresh (`storage.read_cache`)."""
    path = draft_cost_path(key)
    cached = None if refresh else storage.read_cache(path, key, draft_cost_of, REFRESH_HINT)
    if cached is not None and len(cached.seconds_by_requests) >= requests:
        return cached
    with OtherLoad() as load:
        cost = measure()
    if too_busy_to_cache(what or "the drafting cost", cost.spread, load.cores):
        return cost
    record = {"key": key, "name": cost.name, "seconds_by_requests": cost.seconds_by_requests,
              "seconds_per_token": cost.seconds_per_token, "one_position": cost.one_position,
              "block": cost.block}  # fmt: skip
    storage.write_cache(path, record)
    return cost


def cpu_draft_cost(
    target: Transformer, drafter: Drafter, gamma: int, refresh: bool = False, points: list[int] = DRAFT_POINTS
) -> DraftCost:
    """The measured drafting cost of `drafter` at γ on this machine at the drafting-request counts `points`,
    measured once and cached (again on `refresh`, or when a cached one stops short of max(points))."""
    if drafter.max_gamma == 0 or gamma == 0:
        return DraftCost.free()
    context = min(64, target.config.max_seq_len // 4)  # each call then appends one token per request
    return cached_draft_cost(draft_cost_key(target, drafter, gamma),
                             lambda: measure_draft_cost(target, drafter, gamma, points, context), refresh,
                             max(points), "the drafting cost")  # fmt: skip


def roofline_draft_cost(
    config: RooflineConfig,
    drafter_params: float,
    gamma: int,
    parallel: bool = True,
    max_requests: int = 512,
    kv_fraction: float = 1.0,
) -> DraftCost:
    """Drafting on the modelled GPU: the drafter's weights and its own KV cache of the requests' context
    (`kv_fraction` of the target's bytes per context token: its layers over the target's) read per pass.
    Parallel drafters: one pass over n·w tokens for a block of width w (γ, or 1 for `one_position`);
    chain drafters: γ passes over n tokens (one width: their γ)."""
    drafter = replace(config, params=drafter_params, buckets=[], tokens_per_request=gamma if parallel else 1,
                      kv_bytes_per_token=config.kv_bytes_per_token * kv_fraction)  # fmt: skip
    seconds = [
        drafter.seconds(n * gamma) if parallel else gamma * drafter.seconds(n)
        for n in range(1, max_requests + 1)
    ]
    name = f"h200-roofline drafter {drafter_params / 1e9:g}B γ={gamma}"
    if not parallel or gamma < 2:
        return DraftCost(seconds, name)
    narrow = replace(drafter, tokens_per_request=1)
    one = [min(narrow.seconds(n), full) for n, full in zip(range(1, max_requests + 1), seconds)]
    return DraftCost(seconds, name, one_position=one, block=gamma)


def measured_profile_file(path: str | Path) -> tuple[ThroughputProfile, dict[str, DraftCost], str]:
    """What `python -m dspark.bench profile --drafters ... --json PATH` wrote: the measured SPS profile, each
    drafter's drafting cost, and the machine that measured them -- so a notebook replays a committed measurement
    instead of a cache of the machine it runs on."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    measured = record["profiles"][0]  # the others are the H200 models
    profile = ThroughputProfile(measured["steps_per_second"], measured["name"])
    costs = {name: draft_cost_of(fields) for name, fields in record.get("draft_costs", {}).items()}
    if None in costs.values():
        raise ValueError(
            f"{path} holds drafting costs without their catch-up cost: run `bench profile` again"
        )
    return profile, costs, record.get("machine", "an unnamed machine")
