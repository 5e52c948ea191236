"""What a drafting step costs the engine, measured in the engine itself.

`dspark.lab.cost_aware.draft_cost.measure_draft_cost` times the drafter's `propose`
alone. A step in which requests draft costs the engine more than that: it
assembles the proposal of a mixed batch, builds the (R, γ+1, V) target
distributions and runs `verify`, and does the host-side work for every draft.
On the shipped tiny target that is about 1 ms a drafting step beyond `propose`
-- as much as the margins the cost-aware policy weighs at high load.

`engine_draft_cost` therefore measures T_draft(n) as the difference between two
runs of the real `Engine` over the same n requests: every request drafts γ
tokens each step but verifies none (ℓ = 0, so the target pass is the same
one-token-per-request pass as plain decoding), against nobody drafting. Each
step then commits one token per request in both runs, and the per-step
difference is the drafting overhead as the engine pays it. It is measured for
a block of γ and of one position (a third run per pair), so that the scheduler
can price a narrower block (`DraftCost.seconds(n, w)`). The cost per
catch-up token (a request that idled appends the tokens committed meanwhile) is
taken from `measure_draft_cost`. Cached under DSPARK_HOME next to the `propose`
table (same key, plus the method), measured again on `refresh`.

What this file does not do: decide anything (dspark/lab/cost_aware/scheduler.py) or
measure SPS (dspark/profiler.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from dspark.drafters.base import Drafter, Proposal
from dspark.engine import Request
from dspark.lab.cost_aware.draft_cost import (
    DRAFT_POINTS,
    DraftCost,
    cached_draft_cost,
    cpu_draft_cost,
    draft_cost_key,
)
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.profiles import points_up_to, repeat_spread
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.scheduler import Scheduler, ThroughputProfile, make_policy

STEPS = 6  # engine steps per timed run
REPEATS = 3  # interleaved rounds of paired runs per point (the median difference counts)
PROMPT_TOKENS = 32  # each dummy request's prompt (at most a quarter of the target's context)


class DraftButVerifyNothing(Scheduler):
    """Every request drafts the whole block (or, `drafting` False, none does) and verifies nothing: the
    engine step's cost alone, with the one-token target pass of plain decoding."""

    def __init__(self, drafting: bool) -> None:
        super().__init__(make_policy("none"), ThroughputProfile([1.0]))  # (no profile is read)
        self.drafting = drafting

    def speculate(self, history: list, idle_steps: list, gamma: int) -> list[int]:
        return [gamma if self.drafting else 0] * len(history)

    def __call__(self, proposal: Proposal) -> torch.Tensor:
        return torch.zeros(proposal.tokens.shape[0], dtype=torch.long)


def seconds_per_step(
    target: Transformer, drafter: Drafter, gamma: int, requests: int, drafting: bool, prompt_len: int
) -> float:
    """Seconds per engine step over one run of `requests` requests (after a warm-up run) that all draft γ
    tokens and verify none (`drafting`), or that never draft; every step commits one token per request
    either way."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.config.vocab_size, (prompt_len,), generator=g).tolist()
               for _ in range(requests)]  # fmt: skip
    engine = CostAwareEngine(
        target, drafter, SamplingParams(1.0), gamma, requests, None, DraftButVerifyNothing(drafting)
    )
    engine.run([Request(p, 3) for p in prompts])  # warm-up
    result = engine.run([Request(p, STEPS + 1) for p in prompts], torch.Generator().manual_seed(0))
    return (result.seconds - result.prefill_seconds) / max(1, result.steps)


def draft_points(requests: int | None) -> list[int]:
    """The drafting-request counts measured to cover `requests` (None: every DRAFT_POINTS count)."""
    return list(DRAFT_POINTS) if requests is None else points_up_to(DRAFT_POINTS, max(1, requests))


@torch.no_grad()
def measure_engine_draft_cost(
    target: Transformer,
    drafter: Drafter,
    gamma: int,
    points: list[int] = DRAFT_POINTS,
    tick: Callable[[str, int, int], None] | None = None,
    per_token: float | None = None,
) -> DraftCost:
    """T_draft(n) at each n of `points`: an engine step in which n requests draft (and verify nothing) minus
    one in which none does, paired and interleaved (each round runs every n, plain then drafting a block of
    γ and of one position, so a spell of a busy machine hits both sides of a difference), the median over
    `REPEATS` rounds; the catch-up cost per token `per_token`, else from `cpu_draft_cost` (cached). Its
    `spread` is how much the plain steps' repeats disagree (`repeat_spread`: a busy machine); `tick(stage, done,
    total)` is called before the first round and after each."""
    prompt_len = min(PROMPT_TOKENS, target.config.max_seq_len // 4)
    widths = [gamma, 1] if gamma >= 2 else [gamma]  # the full block, and one position (cost(n, w) between)
    differences: dict[tuple[int, int], list[float]] = {(n, w): [] for n in points for w in widths}
    plain_steps: dict[int, list[float]] = {n: [] for n in points}
    stage = f"{drafter.name} drafting {' and '.join(map(str, widths))} positions"
    for done in range(REPEATS + 1):
        if tick is not None:
            tick(stage, done, REPEATS)
        for n in points if done < REPEATS else []:
            plain = seconds_per_step(target, drafter, gamma, n, False, prompt_len)
            plain_steps[n].append(plain)
            for w in widths:
                drafting = seconds_per_step(target, drafter, w, n, True, prompt_len)
                differences[n, w].append(drafting - plain)
    extra = {w: [max(0.0, statistics.median(differences[n, w])) for n in points] for w in widths}
    if per_token is None:
        per_token = cpu_draft_cost(target, drafter, gamma, points=points).seconds_per_token
    name = f"engine-measured {drafter.name} γ={gamma} ({torch.get_num_threads()} threads)"
    one_position = extra[1] if gamma >= 2 else None
    cost = DraftCost.from_points(points, extra[gamma], max(points), name, per_token, one_position, gamma)
    cost.spread = repeat_spread(list(plain_steps.values()))
    return cost


def engine_draft_cost(
    target: Transformer,
    drafter: Drafter,
    gamma: int,
    refresh: bool = False,
    requests: int | None = None,
    tick: Callable[[str, int, int], None] | None = None,
) -> DraftCost:
    """The drafting cost as the engine pays it (`measure_engine_draft_cost`), measured once and cached;
    `refresh` measures it again, and the `propose` table it draws on too. `requests`: the most drafting
    requests the caller needs measured (a cached table that stops short is measured again; None: any cached
    one, else every DRAFT_POINTS count)."""
    if drafter.max_gamma == 0 or gamma == 0:
        return DraftCost.free()
    points = draft_points(requests)

    def measure() -> DraftCost:
        if refresh:  # the `propose` table this cost reads inside: a refresh that kept it could not mend it
            cpu_draft_cost(target, drafter, gamma, refresh=True, points=points)
        return measure_engine_draft_cost(target, drafter, gamma, points, tick)

    key = engine_draft_cost_key(target, drafter, gamma)
    return cached_draft_cost(key, measure, refresh, requests or 1, "drafting")


def engine_draft_cost_key(target: Transformer, drafter: Drafter, gamma: int) -> dict:
    """The cache key of `engine_draft_cost`: the `propose` table's, plus how the engine's cost was measured."""
    return draft_cost_key(target, drafter, gamma) | {
        "method": "engine step, paired, interleaved, isotonic, widths 1 and γ, 6 steps x 3 repeats"
    }
