"""The core's `Engine` with a scheduler that also decides who drafts: the project's speculate-or-not extension.

Each step, before anything is drafted, `scheduler.speculate(history, idle_steps, γ)` gives every request a
block width (0: a plain decode step this time; the drafting ones draft the same width), from earlier rounds
only, so the output stays exact. A request that skips drafting verifies nothing, records no confidences
([]) and keeps what it committed for the drafter's next call. Schedulers without `speculate` (the core's)
let everyone draft γ: then this is the core's engine, round for round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dspark.device import model_device, upload
from dspark.drafters.base import Proposal, TargetFeatures
from dspark.engine import Engine, Round, Run
from dspark.lab.draft_vocab import ReducedProposal
from dspark.requests import RequestRecord

RECENT_ROUNDS = 4  # drafted rounds per request kept for the scheduler's forecast (`CostAwareEngine.recent`)


@dataclass
class PartialProposal(ReducedProposal):
    """A proposal padded to every active request: `drafted` (R,) bool marks the rows that really drafted; the
    others are zeros and verify nothing (q over a reduced vocabulary's K ids where `vocab` is set)."""

    drafted: torch.Tensor | None = None  # (R,) bool


def joined(earlier: tuple[torch.Tensor, TargetFeatures], a: RequestRecord) -> None:
    """`a`'s unseen committed (tokens, features) after the `earlier` chunk it has not shown the drafter yet."""
    (t0, f0), t1, f1 = earlier, a.unseen_tokens, a.unseen_features
    a.unseen_tokens = torch.cat([t0, t1])
    a.unseen_features = TargetFeatures(
        torch.cat([f0.taps, f1.taps]), torch.cat([f0.last_hidden, f1.last_hidden])
    )


class CostAwareEngine(Engine):
    """`Engine` whose scheduler (a `CostAwareScheduler`, or anything with `speculate`) picks, each step, which
    requests draft and how wide."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # per slot: confidences of its last drafted rounds (a list is replaced, never edited), idle steps
        self.recent: dict[int, list[list[float]]] = {}
        self.idle: dict[int, int] = {}
        self.drafting: list[bool] = []  # this step, per active request

    def plan(self, active: list[RequestRecord]) -> list[int]:
        """Per request a block width in 0..γ (0: a plain decode step), from earlier rounds only."""
        gamma, speculate = self.gamma, getattr(self.scheduler, "speculate", None)
        if speculate is None or gamma == 0:
            return [gamma] * len(active)
        history = [self.recent.setdefault(a.slot, []) for a in active]
        widths = speculate(history, [self.idle.get(a.slot, 0) for a in active], gamma)
        if any(not 0 <= w <= gamma for w in widths):
            raise ValueError(f"draft widths must be in 0..{gamma}, got {widths}")
        return widths

    def step(self, run: Run, generator: torch.Generator) -> Round:
        t0 = time.perf_counter()
        widths = self.plan(run.active)
        self.drafting = [w > 0 for w in widths]
        device = model_device(self.target)
        slots = upload([a.slot for a in run.active], device)  # (R,)
        anchors = upload([a.anchor for a in run.active], device)  # (R,)
        R = len(widths)
        if not any(self.drafting):  # nothing to propose, schedule or verify: the step plain decoding takes
            outcome = self.decode_round(slots, anchors, generator)
            self.timed(R, time.perf_counter() - t0)
            return outcome
        t1 = time.perf_counter()
        proposal = self.draft(run.active, slots, anchors, generator, max(widths))
        t2 = time.perf_counter()
        run.draft_seconds += t2 - t1
        run.drafted_rounds += sum(self.drafting)
        outcome = self.verify_round(proposal, [a.length for a in run.active], slots, anchors, generator)
        # an idle request's pass first appended what it committed meanwhile: one token per idle step
        catch_up = sum(self.idle.get(a.slot, 0) for a, d in zip(run.active, self.drafting) if d)
        target_seconds = (t1 - t0) + (time.perf_counter() - t2)
        self.timed(R + sum(outcome.ells), target_seconds, sum(self.drafting), max(widths), t2 - t1, catch_up)
        return outcome

    def timed(self, *timings: float) -> None:
        """The step's timings to the costs a scheduler learns from them (`LearnedCosts.observe`), if it does."""
        learned = getattr(self.scheduler, "learned", None)
        if learned is not None:
            learned.observe(*timings)

    def draft(self, active, slots, anchors, generator, gamma) -> Proposal:
        """The core's proposal for this step's drafting rows, padded with zeros to every row (a
        `PartialProposal`)."""
        rows = [r for r, d in enumerate(self.drafting) if d]
        if len(rows) == len(active):
            return super().draft(active, slots, anchors, generator, gamma)
        device, R = model_device(self.target), len(active)
        index = upload(rows, device)  # (D,) the drafting rows
        proposal = super().draft([active[r] for r in rows], slots[index], anchors[index], generator, gamma)
        tokens = torch.zeros(R, gamma, dtype=torch.long, device=device)  # (R, γ)
        conf = torch.zeros(R, gamma, device=device) if self.drafter.has_confidence else None  # (R, γ)
        drafted = torch.zeros(R, dtype=torch.bool, device=device)
        q = proposal.q.new_zeros(R, gamma, proposal.q.shape[-1])  # (R, γ, K)
        tokens[index], q[index], drafted[index] = proposal.tokens, proposal.q, True
        if conf is not None:
            conf[index] = proposal.confidence.to(conf.dtype)
        return PartialProposal(tokens, q, conf, getattr(proposal, "vocab", None), drafted)

    def verify_lengths(self, proposal: Proposal, lengths: list[int]) -> list[int]:
        """The core's ℓ_r, and 0 for a request that did not draft."""
        ells = super().verify_lengths(proposal, lengths)
        return [ell if drafting else 0 for ell, drafting in zip(ells, self.drafting)]

    def commit(self, run: Run, outcome: Round) -> None:
        """The core's commit; then a request that did not draft records no confidences and keeps its earlier
        committed chunk for the drafter's next call, and one that drafted remembers its confidences."""
        active, kept = list(run.active), [(a.unseen_tokens, a.unseen_features) for a in run.active]
        super().commit(run, outcome)
        for a, drafted, earlier in zip(active, self.drafting, kept):
            last = a.rounds[-1]
            if not drafted and last.confidences is not None:
                last.confidences = []
            if a.stop_reason:  # finished: its slot is free
                continue
            self.idle[a.slot] = 0 if drafted else self.idle.get(a.slot, 0) + 1
            if not drafted and self.gamma > 0:  # (γ = 0: nobody ever drafts, nothing is kept)
                joined(earlier, a)
            elif last.confidences is not None:
                self.recent[a.slot] = [*self.recent.get(a.slot, []), last.confidences][-RECENT_ROUNDS:]

    def finish(self, run: Run, a: RequestRecord) -> None:
        super().finish(run, a)
        self.recent.pop(a.slot, None)
        self.idle.pop(a.slot, None)
