"""The cost-aware scheduler: the drafting time in Θ, and who drafts (speculate or not).

`CostAwareScheduler` is the core's `Scheduler` (dspark/scheduler.py)
with the drafting cost (dspark/lab/cost_aware/draft_cost.py) for the cost-aware
policies (`dspark`, `dspark-async`; any other policy, or a free cost: the core's
scheduler, the paper's step). Every input is an argument: the STS pair and
costs here, the earlier rounds in `speculate`, the round's `Proposal` in
`__call__`, its outcome in `observe`. This is the project's own extension; the
paper prices a step by its target pass alone.

**Speculate or not.** Algorithm 1 chooses verify lengths *after* drafting,
when the drafting pass is already paid. Where drafting is expensive (on this
CPU a DSpark drafting pass costs about a target pass) the better decision
comes first: should request r draft at all this step? A request that does not
draft takes a plain decode step (its anchor alone) in the same ragged target
pass and pays nothing for drafts. The decision must not look at this step's
drafts or confidences (they do not exist yet; and a choice of what to verify
that depended on the drafts would break losslessness). `draft_plan` uses
each request's recent drafted rounds:

  1. forecast: the mean calibrated survivals a_{r,j} = Π_{i≤j} c̃_{r,i} of
     its last few drafted rounds stand in for this round's; a request
     without any (new) gets the mean of earlier requests' *first* drafted
     rounds (answer starts are easier than answer ends, so the others' recent
     rounds would under-forecast it), or the others' mean before any request
     has finished a first round; only when nothing at all is known yet does
     everybody draft, to find out (a round drafted at a narrower width
     counts at the positions it saw);
  2. the forecast verify lengths ℓ̂ and gains G_r = Σ_{j≤ℓ̂_r} a_{r,j} come from
     cost-aware Algorithm 1 on the forecasts, as if everybody drafted -- with
     the early stop for `dspark`, with the global search for `dspark-async`
     (its verify budget comes from that search; on a jagged SPS, CUDA-graph
     buckets, the early stop halts at the first bucket edge and would forecast
     ℓ̂ = 0 for everybody, so the async policy would never get rounds);
  3. requests sorted by G_r; drafting the top k has the expected rate
         Θ̂(k) = (R + Σ_top-k G) / (1/SPS(R + Σ_top-k ℓ̂) + T_draft(k, w_k) + c·Σ_top-k s_r),
     T_draft(0) = 0, where s_r is r's idle steps (the tokens its pass must first
     append) and c the measured cost of one; the k with the largest Θ̂ drafts
     (ties: more drafting);
  4. the block width: γ, unless a narrower block costs less (a parallel
     drafter on a CPU, `DraftCost.width_matters`); then the top k draft
     w_k = min(γ, max ℓ̂ + DRAFT_SLACK) positions, and step 3 prices that
     width. At high load, where Algorithm 1 verifies one or two drafts per
     request, a seven-wide block would pay for five positions nobody checks.

With free drafting everybody drafts, and the step is exactly the paper's. If
drafting could not pay even with every draft accepted, nobody drafts: the step
is plain decoding. The forecast of a request that has stopped drafting fades
toward the other requests' (half-life IDLE_HALF_LIFE steps), so it drafts
again when drafting pays for the others. A request with no others to fade
toward (batch 1) would keep the forecast of the rounds that made it stop for
ever, however much easier its text has become since: so a request idle for
PROBE_STEPS steps drafts one narrow round to look again (a probe, `with_probes`;
on text where drafting does not pay it costs a narrow drafting pass every
PROBE_STEPS + 1 steps).

**Then Algorithm 1** (the core's, unchanged) runs on the drafting requests' real
confidences against `WithDrafting(profile, T_draft)`, the profile of a step that
also drafts: SPS'(B) = 1 / (1/SPS(B) + T_draft), so Θ = τ · SPS'(B) is tokens per
second of the whole step. The drafting time is already spent, so it only makes
verifying relatively cheaper. The early stop is
still what keeps it lossless: admitting draft j of request r depends only on
survivals ranked above it, never on its own acceptance.

What this file does not do: time anything (dspark/profiler.py,
draft_cost.py) or run the step (dspark/engine.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import torch

from dspark.drafters.base import Proposal
from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.lab.cost_aware.learned_costs import LearnedCosts
from dspark.scheduler import (
    AsyncPrefixPolicy,
    Policy,
    Scheduler,
    ThroughputProfile,
    admitted_count,
    prefix_survival,
)

HOST = torch.device("cpu")  # who drafts is a host-side decision made from host-side records
COST_AWARE = ("dspark", "dspark-async")  # the policies that weigh drafting time and decide who drafts
FIRST_ROUNDS = 32  # earlier requests' first drafted rounds remembered to forecast a newcomer's
REALISM_PRIOR = 4.0  # tokens of pseudo-evidence that the forecasts are right, before any round is seen
IDLE_HALF_LIFE = 4.0  # steps after which an idle request's own forecast counts half (the rest: the others')
# positions drafted beyond the longest forecast verify length, where a narrower block costs less: a round
# may beat its forecast, and the position after it is observed, so the forecast can grow again
DRAFT_SLACK = 1
PROBE_STEPS = 8  # idle steps after which a request drafts one narrow round to look again (batch 1 recovers)


class WithDrafting(ThroughputProfile):
    """The profile of a step that also drafts for `draft_seconds`: SPS'(B) = 1 / (1/SPS(B) + draft_seconds),
    so Algorithm 1's Θ = τ · SPS'(B) is tokens per second of the whole step."""

    def __init__(self, base: ThroughputProfile, draft_seconds: float) -> None:
        # made every step: the base's table is shared, not copied or checked again
        self.steps_per_second, self.name = base.steps_per_second, f"{base.name} + drafting"
        self.base, self.draft_seconds = base, draft_seconds

    def sps(self, batch_tokens: int) -> float:
        return 1.0 / (1.0 / self.base.sps(batch_tokens) + self.draft_seconds)

    def table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        raise NotImplementedError("the prefix-scheduler kernel knows no drafting time")


def with_drafting(profile: ThroughputProfile, draft_seconds: float) -> ThroughputProfile:
    """`profile` itself when drafting is free (the paper's Θ to the bit), else `WithDrafting`."""
    return profile if draft_seconds == 0 else WithDrafting(profile, draft_seconds)


def step_rate(
    tokens: float, batch_tokens: int, profile: ThroughputProfile, draft_seconds: float = 0.0
) -> float:
    """Expected tokens per second of a step: `tokens` over its target pass of `batch_tokens` plus its
    drafting time (0: τ · SPS(B), the paper's Θ)."""
    return tokens * with_drafting(profile, draft_seconds).sps(batch_tokens)


def realism_ratio(accepted: float, predicted: float) -> float:
    """Accepted drafts per survival-predicted one, with REALISM_PRIOR tokens of pseudo-evidence for 1."""
    return (accepted + REALISM_PRIOR) / (predicted + REALISM_PRIOR)


def same_lists(kept: list[list], history: list[list]) -> bool:
    """Whether `history` holds the very lists kept from an earlier step (the engine replaces a request's list
    when it drafts and never edits one, so the same objects mean the same rounds)."""
    return len(kept) == len(history) and all(a is b for a, b in zip(kept, history))


def drafting_can_pay(requests: int, gamma: int, profile: ThroughputProfile, cost: DraftCost) -> bool:
    """Could drafting beat plain decoding for `requests` requests if every draft were accepted (at any
    block width, where a narrower block costs less)?"""
    if requests == 0 or gamma == 0:
        return False
    widths = range(1, gamma + 1) if cost.width_matters else [gamma]
    best = max(step_rate(requests * (1 + w), requests * (1 + w), profile, cost.seconds(requests, w))
               for w in widths)  # fmt: skip
    return best > step_rate(requests, requests, profile)


def with_probes(widths: list[int], idle_steps: list[int], gamma: int, width_matters: bool) -> list[int]:
    """`widths` with every request idle for PROBE_STEPS or more steps drafting too: at the width the others
    draft, else a narrow block (1 + DRAFT_SLACK positions where a narrower block costs less, else γ). Its
    round refreshes the forecast that made it stop; like every decision here it reads earlier steps only."""
    probing = [w == 0 and idle >= PROBE_STEPS for w, idle in zip(widths, idle_steps)]
    if not any(probing):
        return widths
    width = max(widths) or (min(gamma, 1 + DRAFT_SLACK) if width_matters else gamma)
    return [width if w or probe else 0 for w, probe in zip(widths, probing)]


@dataclass
class ForecastParts:
    """What a forecast takes from the earlier rounds alone, before the idle steps fade it: it changes only
    when a request drafts, arrives or leaves (or a first round is remembered), not from one idle step to the
    next, so `CostAwareScheduler.speculate` keeps it while the histories are the same lists. Plain Python
    numbers (R ≤ a few dozen, γ ≤ 16: a tensor op would cost more than the arithmetic it does). `own` is
    None when nothing is known (no request has drafted and no first round is remembered)."""

    own: list[list[float]] | None  # (R, γ) each request's mean calibrated survivals over its rounds
    known: list[list[bool]] | None  # (R, γ) some round of the request saw position j
    has_rounds: list[bool] | None  # (R,)
    population: list[float] | None  # (γ,) the mean of the requests that saw each position (else newcomer's)
    newcomer: list[float] | None  # (γ,) the mean of earlier requests' first rounds, or None without any
    newcomer_seen: list[int] | None  # (γ,) how many of those first rounds saw each position
    alone: list[bool] | None = None  # (γ,) exactly one request saw position j: the population is that request


def mean_survivals(rounds: list[list[float]], gamma: int) -> tuple[list[float], list[int]]:
    """(γ,) the mean of calibrated survival rows over the rounds that saw each position, and how many saw it
    (a round drafted at a narrower width knows fewer positions; 0 where none saw it)."""
    sums, seen = [0.0] * gamma, [0] * gamma
    for row in rounds:
        for j, a in enumerate(row):
            sums[j] += a
            seen[j] += 1
    return [total / max(n, 1) for total, n in zip(sums, seen)], seen


def forecast_parts(
    history: list[list[list[float]]],
    gamma: int,
    sts: torch.Tensor | None = None,
    first_rounds: list[list[float]] | None = None,
) -> ForecastParts:
    """The idle-independent part of `forecast_survivals`: every round through `prefix_survival` together
    (one call), then the means per request, of the population and of the first rounds, in Python."""
    counts = [len(h) for h in history]
    first_rounds = first_rounds or []
    if not any(counts) and not first_rounds:
        return ForecastParts(None, None, None, None, None, None)
    rounds = [c[:gamma] for h in history for c in h] + [c[:gamma] for c in first_rounds]
    # a narrower round is padded for the one `prefix_survival` call, then cut back to the positions it saw
    padded = torch.tensor([[*c, *[0.0] * (gamma - len(c))] for c in rounds], dtype=torch.float64, device=HOST)
    survivals = [row[: len(c)] for row, c in zip(prefix_survival(padded, sts).tolist(), rounds)]
    own, known, at = [], [], 0
    for n in counts:
        mean, seen = mean_survivals(survivals[at : at + n], gamma)
        own.append(mean)
        known.append([k > 0 for k in seen])
        at += n
    newcomer = newcomer_seen = None
    if first_rounds:  # (γ,) a first round's mean, and how many first rounds saw each position
        newcomer, newcomer_seen = mean_survivals(survivals[at:], gamma)
    # the population at each position: the mean of the requests that saw it, else the first rounds', else 0
    seen_by = [[r for r in range(len(history)) if known[r][j]] for j in range(gamma)]
    population = [
        sum(own[r][j] for r in rs) / len(rs) if rs else (newcomer[j] if newcomer is not None else 0.0)
        for j, rs in enumerate(seen_by)
    ]
    alone = [len(rs) == 1 for rs in seen_by]
    return ForecastParts(own, known, [n > 0 for n in counts], population, newcomer, newcomer_seen, alone)


def faded_forecast(parts: ForecastParts, idle_steps: list[int]) -> list[list[float]] | None:
    """(R, γ) rows: the forecast of `forecast_survivals` from its `parts` and this step's idle steps (None
    when nothing is known)."""
    if parts.own is None:
        return None
    rows = []
    for own, known, has_rounds, idle in zip(parts.own, parts.known, parts.has_rounds, idle_steps):
        faded = 0.5 ** (idle / IDLE_HALF_LIFE) if has_rounds else 0.0  # the own rounds' weight
        row, low = [], float("inf")
        for j, population in enumerate(parts.population):
            if parts.newcomer is not None and not has_rounds and parts.newcomer_seen[j] > 0:
                f = parts.newcomer[j]  # a request without rounds: the first rounds' mean where they saw j
            else:  # a position one request alone saw: its population is that request, whatever the fade
                w = (1.0 if parts.alone[j] else faded) if known[j] else 0.0
                f = w * own[j] + (1 - w) * population
            # positions mixed from different rounds (narrow ones count only where they saw) may rise along
            # j; a survival never does (a no-op when every round saw every position)
            low = min(low, f)
            row.append(low)
        rows.append(row)
    return rows


def forecast_survivals(
    history: list[list[list[float]]],
    idle_steps: list[int],
    gamma: int,
    sts: torch.Tensor | None = None,
    first_rounds: list[list[float]] | None = None,
) -> torch.Tensor | None:
    """(R, γ) float64 forecast of this step's survivals from earlier rounds: each request's mean calibrated
    survivals over its recent drafted rounds, faded toward the other requests' mean the longer it has been
    idle (half-life IDLE_HALF_LIFE steps); a request that never drafted gets the mean of `first_rounds`
    (raw confidences of earlier requests' first drafted rounds) or, without any, the others' mean; a request
    that is the only one with rounds keeps exactly its own. None when nothing is known: no request has
    drafted and no first round is remembered. All rounds go through `prefix_survival` together
    (`forecast_parts`), then the idle steps fade them (`faded_forecast`)."""
    rows = faded_forecast(forecast_parts(history, gamma, sts, first_rounds), idle_steps)
    return None if rows is None else torch.tensor(rows, dtype=torch.float64, device=HOST).reshape(-1, gamma)


def forecast_lengths(forecast: list[list[float]], profile: ThroughputProfile, early_stop: bool) -> list[int]:
    """(R,) verify lengths of the core's Algorithm 1 (`admitted_count`, the same walk) on forecast survivals
    held as Python lists: the same greedy path (descending survival, ties by position, then request) sorted on
    the host, since a few dozen small tensor ops would cost more than the numbers they handle."""
    path = sorted((-a, j, r) for r, row in enumerate(forecast) for j, a in enumerate(row))
    n_admit = admitted_count((-neg for neg, _, _ in path), len(forecast), profile, early_stop)
    lengths = [0] * len(forecast)
    for _, _, r in path[:n_admit]:
        lengths[r] += 1
    return lengths


def draft_plan(
    history: list[list[list[float]]],
    idle_steps: list[int],
    gamma: int,
    profile: ThroughputProfile,
    cost: DraftCost,
    sts: torch.Tensor | None = None,
    realism: float = 1.0,
    first_rounds: list[list[float]] | None = None,
    early_stop: bool = True,
    parts: Callable[[], ForecastParts] | None = None,
    can_pay: bool | None = None,
) -> tuple[torch.Tensor, int]:
    """((R,) bool which requests draft this step, the block width w they draft: 0 when none does).

    history[r]: the raw confidences c_1..c_w of request r's most recent drafted rounds (at most
    RECENT_ROUNDS, oldest first; empty: it has not drafted yet); idle_steps[r]: steps since it last drafted;
    realism: accepted drafts per forecast one so far (`CostAwareScheduler.realism`), which scales the gains;
    first_rounds: earlier requests' first drafted rounds (`CostAwareScheduler.first_rounds`), a newcomer's forecast;
    early_stop: False forecasts ℓ̂ with the global search (the async policy's, whose budget comes from it): on
    a jagged SPS (CUDA-graph buckets) the early stop halts at the first bucket edge and forecasts ℓ̂ = 0.
    The width is γ unless a narrower block costs less (`DraftCost.width_matters`): then the top k drafting
    requests draft w = min(γ, max forecast ℓ̂ + DRAFT_SLACK) positions, priced at that width.
    parts: a function giving `forecast_parts(history, gamma, sts, first_rounds)`, called only where
    a forecast is needed, if the caller keeps them (the same decision, without recomputing what only new
    rounds change); can_pay: `drafting_can_pay(R, gamma, profile, cost)` if the caller knows it.
    After the one `prefix_survival` call, everything is host-side Python: the forecast verify lengths are the
    core's Algorithm 1 walk on the forecasts against the profile of a step that drafts (`forecast_lengths`)."""
    R = len(history)
    if cost.is_free:
        return torch.ones(R, dtype=torch.bool, device=HOST), gamma
    if not (can_pay if can_pay is not None else drafting_can_pay(R, gamma, profile, cost)):
        return torch.zeros(R, dtype=torch.bool, device=HOST), 0
    kept = parts() if parts is not None else forecast_parts(history, gamma, sts, first_rounds)
    forecast = faded_forecast(kept, idle_steps)  # (R, γ) rows
    if forecast is None:  # nothing learnt yet: draft the whole block to find out
        return torch.ones(R, dtype=torch.bool, device=HOST), gamma
    ell = forecast_lengths(forecast, with_drafting(profile, cost.seconds(R)), early_stop)  # as if all drafted
    gain = [realism * sum(row[:n]) for row, n in zip(forecast, ell)]  # expected accepted drafts if r drafts
    order = sorted(range(R), key=lambda r: -gain[r])  # stable: ties keep the request order
    cum_gain = [0.0, *accumulate(gain[r] for r in order)]
    cum_len = [0, *accumulate(ell[r] for r in order)]
    # the block the top k draft: as wide as the longest forecast verify length among them, plus slack
    widths = [gamma] * (R + 1)
    if cost.width_matters:
        widths = [min(gamma, w + DRAFT_SLACK) for w in [0, *accumulate((ell[r] for r in order), max)]]
    # an idle request brings the tokens committed while it idled: its drafting pass appends them first
    cum_idle = [0, *accumulate(idle_steps[r] for r in order)]
    rates = [step_rate(R + cum_gain[k], R + cum_len[k], profile,
                       cost.seconds(k, widths[k]) + cost.seconds_per_token * cum_idle[k])
             for k in range(R + 1)]  # fmt: skip
    k = max(range(R + 1), key=lambda i: (rates[i], i))
    chosen = set(order[:k])
    mask = torch.tensor([r in chosen for r in range(R)], dtype=torch.bool, device=HOST)
    return mask, (widths[k] if k else 0)


class CostAwareScheduler(Scheduler):
    """The core's `Scheduler` that also weighs the drafting time: who drafts (`speculate`, `draft_plan`) and,
    when some request drafted, Algorithm 1 against the profile of a step that drafts. Only the cost-aware
    policies (COST_AWARE) see the cost; for any other policy, or a free cost (None), it is the paper's step."""

    def __init__(
        self,
        policy: Policy,
        profile: ThroughputProfile,
        sts: torch.Tensor | None = None,
        draft_cost: DraftCost | None = None,
        learned: LearnedCosts | None = None,
    ) -> None:
        super().__init__(policy, profile, sts)
        seen = policy.name in COST_AWARE and draft_cost is not None
        self.draft_cost = draft_cost if seen else DraftCost.free()
        # the costs learnt from the run's own steps (the engine's `timed`), read at each refit; None: the given ones
        self.learned = learned if seen and not self.draft_cost.is_free else None
        self.costs_version = -1
        self.accepted_total = self.predicted_total = 0.0  # over every drafted round: realised vs forecast
        self._predicted: torch.Tensor | None = None  # (R,) this round's survival-predicted accepted drafts
        self._last_decision: tuple | None = None  # (inputs, history lists, widths) of the last `speculate`
        self._parts: tuple | None = None  # ((γ, first rounds' version), history lists, their ForecastParts)
        self.first_rounds: deque[list[float]] = deque(maxlen=FIRST_ROUNDS)  # earlier requests' first rounds
        self.first_rounds_seen = 0  # how many were ever remembered (the memory's version)
        # (R, γ) -> drafting_can_pay, which the profile and the cost fix (until the learnt costs change)
        self._can_pay: dict[tuple[int, int], bool] = {}
        self.read_learned_costs()

    def read_learned_costs(self) -> None:
        """Take the learnt profile and drafting cost after each refit; what they fixed is decided again."""
        if self.learned is None or self.learned.version == self.costs_version:
            return
        self.profile, self.draft_cost = self.learned.profile, self.learned.cost
        self.costs_version = self.learned.version
        self._can_pay.clear()
        self._last_decision = None

    def speculate(self, history: list[list[list[float]]], idle_steps: list[int], gamma: int) -> list[int]:
        """Per request, how many positions it drafts this step (0: it does not draft; the drafting ones all
        draft the same block width), from their recent drafted rounds only (`draft_plan`): never from this
        step's drafts, so the decision keeps the output exact.
        Called once per step: a request with one round that drafted last step (idle 0) has just finished
        its first drafted round, which is remembered to forecast later newcomers (`first_rounds`).

        The last decision is reused while its inputs are unchanged -- the same history lists (the engine
        replaces a request's list when it drafts, never edits it), the same realism and first rounds, and
        the same idle steps where they matter (they only fade one request's forecast toward the others'): a
        lone request that stopped drafting costs nothing per step to keep not drafting. On top of the
        decision, a request idle for PROBE_STEPS steps drafts once to look again (`with_probes`), where
        drafting can pay at all."""
        self.read_learned_costs()
        for h, idle in zip(history, idle_steps):
            if len(h) == 1 and idle == 0:
                self.first_rounds.append(h[0])
                self.first_rounds_seen += 1
        fades = sum(1 for h in history if h) > 1
        key = (gamma, self.realism, self.first_rounds_seen, tuple(idle_steps) if fades else len(idle_steps))
        R = len(history)
        if (R, gamma) not in self._can_pay:
            self._can_pay[R, gamma] = drafting_can_pay(R, gamma, self.profile, self.draft_cost)
        last = self._last_decision
        if last is not None and last[0] == key and same_lists(last[1], history):
            widths = last[2]
        else:
            widths = self.decide(history, idle_steps, gamma)
            self._last_decision = (key, list(history), widths)
        if not self._can_pay[R, gamma] or self.draft_cost.is_free:
            return widths
        return with_probes(widths, idle_steps, gamma, self.draft_cost.width_matters)

    def decide(self, history: list[list[list[float]]], idle_steps: list[int], gamma: int) -> list[int]:
        """`draft_plan`'s widths, the forecast parts kept while only the idle steps move (`speculate`)."""

        def parts() -> ForecastParts:
            """What only new rounds change, kept while the history lists are the same: a step in which only
            the idle steps moved recomputes the fade and the walk, not every round's calibrated survivals."""
            parts_key, kept = (gamma, self.first_rounds_seen), self._parts
            if kept is not None and kept[0] == parts_key and same_lists(kept[1], history):
                return kept[2]
            fresh = forecast_parts(history, gamma, self.sts, list(self.first_rounds))
            self._parts = (parts_key, list(history), fresh)
            return fresh

        R = len(history)
        mask, width = draft_plan(
            history,
            idle_steps,
            gamma,
            self.profile,
            self.draft_cost,
            self.sts,
            self.realism,
            list(self.first_rounds),
            # the async policy's budget is a global search: its forecast searches the same way
            early_stop=not isinstance(self.policy, AsyncPrefixPolicy),
            parts=parts,
            can_pay=self._can_pay[R, gamma],
        )
        return [width if m else 0 for m in mask.tolist()]

    @property
    def realism(self) -> float:
        """Accepted drafts per survival-predicted one over every drafted round so far, with REALISM_PRIOR
        tokens of pseudo-evidence for 1: an online correction of the forecasts' optimism (the requests that
        draft are those whose recent confidences were high), which never collapses on one unlucky round."""
        return realism_ratio(self.accepted_total, self.predicted_total)

    def confidences(self, proposal: Proposal) -> torch.Tensor:
        """(R, γ) confidences, 0 where a request did not draft (`PartialProposal.drafted`)."""
        conf, drafted = super().confidences(proposal), getattr(proposal, "drafted", None)
        return conf if drafted is None else conf * drafted[:, None]

    def __call__(self, proposal: Proposal) -> torch.Tensor:
        """(R,) verify lengths for this round's proposal; 0 for the rows that did not draft."""
        R, gamma = proposal.tokens.shape
        drafted = getattr(proposal, "drafted", None)
        if self.draft_cost.is_free:  # the paper's scheduler (on the device kernel where it applies)
            lengths = super().__call__(proposal)
            return lengths if drafted is None else lengths * drafted
        # host sync (only when some rows did not draft): a count for the cost table
        n_drafting = R if drafted is None else drafted.sum().tolist()
        # the kernel knows no drafting time: the survivals once, for the lengths and for realism
        survivals = prefix_survival(self.confidences(proposal), self.sts)  # (R, γ)
        paid = with_drafting(self.profile, self.draft_cost.seconds(n_drafting, gamma))  # the block was γ wide
        lengths = self.policy.lengths(survivals, paid)
        lengths = lengths if drafted is None else lengths * drafted
        keep = torch.arange(gamma, device=survivals.device)[None, :] < lengths[:, None]
        self._predicted = (survivals * keep).sum(dim=1)  # (R,) what the survivals predicted: 0 where no draft
        return lengths

    def observe(self, verify_lens: torch.Tensor, accepted: torch.Tensor) -> None:
        """This round's verify lengths and accepted counts (policies that learn from history; realism)."""
        super().observe(verify_lens, accepted)
        predicted, self._predicted = self._predicted, None  # None: nobody drafted this round
        if predicted is not None:  # host sync (cost-aware only): two sums for the realism ratio
            self.accepted_total += float(accepted.sum())
            self.predicted_total += float(predicted.sum())
