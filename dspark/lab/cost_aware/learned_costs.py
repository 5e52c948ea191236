"""The costs a run learns from its own steps: the measured SPS profile and drafting cost as the prior,
corrected by what each step of the engine really took.

The one-off measurement (`profiles.cpu_profile`, `step_cost.engine_draft_cost`, ~12 s) times a target pass
and the drafting overhead apart from a run, once. A step inside a run costs something else: the engine's own
work around the target pass (sampling, verification, host reads and bookkeeping: about 6 ms of a 58 ms
SmolLM2 step on an AVX2 CPU, which the profile never sees), and a quick measurement moves between takes
(four back-to-back ones on an idle machine gave SPS(8)/SPS(1) from 0.64 to 0.72). At batch 1 the
speculate-or-not decision sits on exactly these margins: a drafting step pays when its expected tokens
outrun its extra seconds, and a few milliseconds either way decide it.

`LearnedCosts` keeps the last WINDOW steps of the run: for each, the target part's time (the step less its
drafting pass: the target pass, the verification, the scheduler's own work) over the prior's time for its
batch size B, and the drafting pass's time (with the catch-up tokens of requests that had idled, priced by
the prior) over the prior's for its (drafting requests n, block width w). The estimate at a point is the
prior times a ratio: the median ratio seen there, pulled toward the median ratio of all points by
PRIOR_STEPS pseudo-steps (a point seen once follows the others' correction, a point seen often its own).
Ratios, from one recent window, so that a load that slows every step alike changes no decision, and a
passing stall (the median) none at all. The target's times are then made non-decreasing in B (a larger
pass never costs less, as the one-off profile assumes too). Every REFIT_STEPS steps the scheduler reads a
new profile and cost.

The decisions stay exact: they read only earlier steps' times, never this step's drafts.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Callable, Hashable

from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.profiler import isotonic_fit
from dspark.scheduler import ThroughputProfile

WINDOW = 48  # the run's last steps learnt from (every point from the same recent period of the machine)
PRIOR_STEPS = 4  # pseudo-steps of the all-points ratio at every point
REFIT_STEPS = 8  # steps between two new estimates (decisions stay put in between)


class LearnedDraftCost(DraftCost):
    """`prior`'s T_draft(n, w) times the ratio learnt at (n, w) (`LearnedCosts`)."""

    def __init__(self, prior: DraftCost, ratio: Callable[[Hashable], float]) -> None:
        super().__init__(**{k: getattr(prior, k) for k in prior.__dataclass_fields__})
        self.name = f"{prior.name}, learnt from the run's steps"
        self.prior, self.ratio = prior, ratio
        self.seconds_per_token = prior.seconds_per_token * ratio(None)

    def seconds(self, requests: int, width: int | None = None) -> float:
        if requests <= 0:
            return 0.0
        return self.prior.seconds(requests, width) * self.ratio(point(self.prior, requests, width))


def point(cost: DraftCost, requests: int, width: int | None) -> tuple[int, int | None]:
    """Where a drafting pass is learnt: (n, w), w capped at the full block (None: the full block); (n, None)
    where the width does not change the cost."""
    if not cost.width_matters:
        return requests, None
    return requests, None if width is None or width >= cost.block else width


class LearnedCosts:
    """The SPS profile and drafting cost of the steps seen so far (`profile`, `cost`; the prior until the
    first refit), learnt by `observe` from each step's timings; `version` counts the refits."""

    def __init__(self, profile: ThroughputProfile, cost: DraftCost) -> None:
        self.prior_profile, self.prior_cost = profile, cost
        self.profile, self.cost, self.version = profile, cost, 0
        self.target: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (B, seconds / prior's)
        self.drafting: deque[tuple[tuple, float]] = deque(maxlen=WINDOW)  # ((n, w), seconds / prior's)
        self.steps = 0

    def observe(
        self,
        batch_tokens: int,
        target_seconds: float,
        drafting: int = 0,
        width: int = 0,
        draft_seconds: float = 0.0,
        catch_up_tokens: int = 0,
    ) -> None:
        """One step: its target part (`batch_tokens` tokens in `target_seconds`) and, if `drafting` requests
        drafted a block of `width`, the drafting pass (`draft_seconds`, of which `catch_up_tokens` extra
        context tokens of requests that had idled)."""
        self.target.append((batch_tokens, target_seconds * self.prior_profile.sps(batch_tokens)))
        if drafting:
            cost = self.prior_cost
            prior = cost.seconds(drafting, width) + cost.seconds_per_token * catch_up_tokens
            self.drafting.append((point(cost, drafting, width), draft_seconds / prior))
        self.steps += 1
        if self.steps % REFIT_STEPS == 0:
            self.refit()

    def refit(self) -> None:
        """New `profile` and `cost` from the ratios of the last WINDOW steps."""
        ratio = ratios(self.target)
        longest = max(self.prior_profile.max_tokens, *(B for B, _ in self.target))
        times = [ratio(B) / self.prior_profile.sps(B) for B in range(1, longest + 1)]
        name = f"{self.prior_profile.name}, learnt from the run's steps"
        self.profile = ThroughputProfile([1.0 / t for t in isotonic_fit(times)], name)
        if self.drafting:
            self.cost = LearnedDraftCost(self.prior_cost, ratios(self.drafting))
        self.version += 1


def ratios(seen: deque[tuple[Hashable, float]]) -> Callable[[Hashable], float]:
    """point -> the learnt ratio there: the median of its own ratios, pulled toward the median of all by
    PRIOR_STEPS pseudo-steps (None, or a point never seen: the median of all)."""
    overall = statistics.median(r for _, r in seen)
    by_point: dict[Hashable, list[float]] = defaultdict(list)
    for at, r in seen:
        by_point[at].append(r)
    own = {at: (statistics.median(rs), len(rs)) for at, rs in by_point.items()}

    def ratio(at: Hashable) -> float:
        median, n = own.get(at, (overall, 0))
        return (n * median + PRIOR_STEPS * overall) / (n + PRIOR_STEPS)

    return ratio
