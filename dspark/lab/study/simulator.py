"""Trace-driven simulation of the serving engine on a modelled GPU (walkthrough/DESIGN.md section 6).

This CPU cannot show what happens at production scale, where the target pass
is memory-bound until hundreds of batch tokens. So: record what the real
drafters do on held-out prompts (per round: the confidences c_1..c_γ and how
many drafts full verification accepted, a), then replay those rounds through
any policy and any SPS profile (dspark/profiler.py). With lossless
verification a round that verifies ℓ drafts accepts exactly min(ℓ, a) of them
(position k's verdict never depends on later positions), so the replay needs
no model at all.

Closed loop at concurrency C: C requests are active; each step a cost-aware
policy first decides from earlier rounds which requests draft
(dspark/lab/cost_aware/scheduler.py; the others draft nothing), every active request
plays its next recorded round, the policy picks ℓ_r from the (calibrated)
survivals of the drafting ones, the step takes 1 / SPS(B) + T_draft(n, w)
seconds for B = Σ_r (1 + ℓ_r), n drafting requests and block width w (`DraftCost`, e.g. the
H200 roofline of dspark/lab/cost_aware/draft_cost.py; a block narrower than γ
replays the recorded round's first positions -- for a parallel drafter, whose
block attends within itself, an approximation), each request emits
min(ℓ_r, a_r) + 1 tokens, and a request that reaches its recorded length
leaves and the next one enters. Requests cycle through their rounds if short
verification makes them need more rounds than were recorded.

Output: the same metrics as the measured benchmark (throughput, tokens/s per
user = 1 / TPOT, mean verify length, τ). What this file does not do: model
prefill (every request starts decoding on admission) or run any network.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from dspark.drafters.base import Proposal
from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.lab.cost_aware.engine import RECENT_ROUNDS, PartialProposal
from dspark.lab.cost_aware.scheduler import COST_AWARE, CostAwareScheduler
from dspark.scheduler import Policy, ThroughputProfile


@dataclass
class RequestTrace:
    confidences: list[list[float]]  # per recorded round: c_1..c_γ (ones if the drafter has no head)
    accepted: list[int]  # per recorded round: drafts accepted under full verification
    length: int  # tokens the request emitted in the recording


def traces_from_records(
    verify_lens: list[list[int]], accepted: list[list[int]], confidences: list[list[list[float]]], gamma: int
) -> list[RequestTrace]:
    """One trace per recorded request (rounds that were not fully verified are dropped)."""
    traces = []
    for L, A, C in zip(verify_lens, accepted, confidences):
        keep = [(c if c else [1.0] * gamma, a) for ell, a, c in zip(L, A, C or [[]] * len(L)) if ell == gamma]
        if keep:
            traces.append(RequestTrace([c for c, _ in keep], [a for _, a in keep], sum(a + 1 for a in A)))
    return traces


def simulate(
    traces: list[RequestTrace],
    policy: Policy,
    profile: ThroughputProfile,
    concurrency: int,
    gamma: int,
    requests: int,
    temperatures: torch.Tensor | None = None,
    draft_cost: DraftCost | None = None,
    cost_aware: bool = True,
    seed: int = 0,
) -> dict:
    """Serve `requests` requests (drawn from the traces) at closed-loop `concurrency`; every drafting step
    pays `draft_cost` (None: drafting is free). Cost-aware policies (`dspark`, `dspark-async`) also weigh
    it and decide who drafts, unless `cost_aware` is False (the ablation: the cost is paid, not seen)."""
    draft_cost = draft_cost or DraftCost.free()
    decide = cost_aware and policy.name in COST_AWARE and not draft_cost.is_free
    if not traces:
        raise ValueError("no traces to replay")
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(traces), (requests,), generator=g).tolist()
    queue = list(range(requests))
    active: list[dict] = []
    clock, steps, verified, rounds, emitted_total, draft_time = 0.0, 0, 0, 0, 0, 0.0
    # the engine's own scheduler: who drafts (forecasts, first-round memory, realism), then the verify lengths
    scheduler = CostAwareScheduler(policy, profile, temperatures, draft_cost if cost_aware else None)
    tpots: list[float] = []
    while queue or active:
        while queue and len(active) < concurrency:
            trace = traces[picks[queue.pop(0)]]
            # the first token comes from the prefill; decoding starts right away
            active.append({"trace": trace, "round": 0, "emitted": 1, "start": clock, "recent": [], "idle": 0})
        widths = torch.full((len(active),), gamma, dtype=torch.long)
        if decide:  # from the earlier rounds only, as in the engine
            history, idle = [s["recent"] for s in active], [s["idle"] for s in active]
            widths = torch.tensor(scheduler.speculate(history, idle, gamma), dtype=torch.long)
        drafting, width = widths > 0, int(widths.max()) if len(active) else 0
        n_drafting = int(drafting.sum()) if gamma else 0
        conf = torch.tensor([s["trace"].confidences[s["round"] % len(s["trace"].accepted)] for s in active])
        conf = conf[:, : width or gamma]  # a narrower block: the recorded round's first positions stand in
        draft_seconds = draft_cost.seconds(n_drafting, width)
        # a proposal of the recorded confidences (the scheduler reads no tokens or q)
        blank = torch.zeros_like(conf, dtype=torch.long), torch.zeros(*conf.shape, 1), conf
        proposal = PartialProposal(*blank, drafted=drafting) if decide else Proposal(*blank)
        lengths = scheduler(proposal)
        full = torch.tensor([s["trace"].accepted[s["round"] % len(s["trace"].accepted)] for s in active])
        accepted = torch.minimum(lengths, full)
        scheduler.observe(lengths, accepted)
        B = len(active) + int(lengths.sum())
        clock += 1.0 / profile.sps(B) + draft_seconds
        draft_time += draft_seconds
        for s, c, d in zip(active, conf.tolist(), drafting.tolist()):
            s["recent"], s["idle"] = (
                ([*s["recent"], c][-RECENT_ROUNDS:], 0) if d else (s["recent"], s["idle"] + 1)
            )
        steps += 1
        verified += int(lengths.sum())
        rounds += len(active)
        still = []
        for s, a in zip(active, accepted.tolist()):
            new = min(a + 1, s["trace"].length - s["emitted"])
            s["emitted"] += new
            emitted_total += new
            s["round"] += 1
            if s["emitted"] >= s["trace"].length:
                if s["emitted"] > 1:
                    tpots.append((clock - s["start"]) / (s["emitted"] - 1))
            else:
                still.append(s)
        active = still
    total_tokens = emitted_total + requests  # + the first token of every request
    return {
        "concurrency": concurrency,
        "throughput": total_tokens / clock if clock else float("nan"),
        "tps_per_user": statistics.mean(1 / t for t in tpots) if tpots else float("nan"),
        "tpot_ms": 1000 * statistics.mean(tpots) if tpots else float("nan"),
        "mean_verify_len": verified / max(1, rounds),
        "tau": emitted_total / max(1, rounds),
        "steps": steps,
        "draft_share": draft_time / clock if clock else 0.0,  # of all step time, spent drafting
    }
