"""Verify-length policies, among them DSpark's hardware-aware prefix scheduler (Algorithm 1; DESIGN.md §5).

With prefix survivals a_{r,j} = Π_{i<=j} c_{r,i} (calibrated, non-increasing in j) and verify lengths ℓ_r:

    B = Σ_r (1 + ℓ_r),   τ = Σ_r (1 + Σ_{j<=ℓ_r} a_{r,j}),   maximise Θ = τ · SPS(B)

* early stop: walk all (r, j) by descending a (ties: earlier j, so prefixes stay prefixes) and stop at the
  first step that does not raise Θ. Admitting x_{r,j} then depends only on survivals ranked above it, none
  of which depends on x_{r,j}: lossless.
* `early_stop=False`, the global argmax along the path, may admit x_{r,j} because of a_{r,j+1}, which
  depends on x_{r,j} itself: NOT lossless (paper Appendix A).
* `AsyncPrefixPolicy`: budget K from the argmax over survivals two rounds old, then the current top K.

`Scheduler` binds a policy to its SPS profile and STS pair for the engine; for `dspark` each round is
`Engine.verify_lengths` -> `Scheduler.__call__` -> `prefix_schedule` (the policy's lengths) -> `admitted_count`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from dspark.drafters.base import Drafter, Proposal
from dspark_kernels import use_kernel

POLICY_NAMES = ("none", "mtp1", "fixed", "threshold", "goodput", "dspark", "dspark-async")


@dataclass
class ThroughputProfile:
    """SPS(B): target steps per second with B tokens in one pass, for B = 1..len(steps_per_second)."""

    steps_per_second: list[float]  # entry B-1 is SPS(B)
    name: str = ""  # where it came from ("cpu-measured", "h200-roofline", ...)
    _tables: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # device -> table()

    @property
    def max_tokens(self) -> int:
        return len(self.steps_per_second)

    def sps(self, batch_tokens: int) -> float:
        """SPS(B), B >= 1. Beyond the table a step is assumed to take proportionally longer."""
        if batch_tokens <= self.max_tokens:
            return self.steps_per_second[batch_tokens - 1]
        return self.steps_per_second[-1] * self.max_tokens / batch_tokens

    def table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The (M,) fp32 SPS table on `device`, for the device scheduler (made once per device)."""
        device = torch.device(device)
        if device not in self._tables:
            self._tables[device] = torch.tensor(self.steps_per_second, dtype=torch.float32, device=device)
        return self._tables[device]


def temperatures_and_offsets(sts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, b), each (γ',), of an STS pair: (γ',) temperatures (b = 0) or (2, γ') temperatures and offsets."""
    if sts.dim() == 2:
        return sts[0], sts[1]
    return sts, torch.zeros_like(sts)


def prefix_survival(confidences: torch.Tensor, sts: torch.Tensor | None = None) -> torch.Tensor:
    """(R, γ) confidences -> (R, γ) survivals a_{r,j} = Π_{i<=j} c̃_{r,i}, c̃ = σ(logit(c) / T_j − b_j)
    (no STS pair: c̃ = c); increasing in c, so the order inside a position never changes."""
    c = confidences.double()
    if sts is not None:
        t, b = (x[: c.shape[1]] for x in temperatures_and_offsets(sts.to(c.device, torch.float64)))
        c = torch.sigmoid(torch.logit(c.clamp(1e-12, 1 - 1e-12)) / t - b)
    return c.cumprod(dim=1)


def greedy_path(survivals: torch.Tensor) -> torch.Tensor:
    """(R·γ, 2) [r, j] in admission order: descending survival, ties by position, then request."""
    R, gamma = survivals.shape
    r = torch.arange(R, device=survivals.device).repeat_interleave(gamma)
    j = torch.arange(gamma, device=survivals.device).repeat(R)
    a = survivals.flatten()
    # stable sorts from the last key to the first
    order = torch.argsort(r, stable=True)
    order = order[torch.argsort(j[order], stable=True)]
    order = order[torch.argsort(-a[order], stable=True)]
    return torch.stack([r[order], j[order]], dim=1)


def admitted_count(
    gains: Iterable[float], requests: int, profile: ThroughputProfile, early_stop: bool = True
) -> int:
    """Algorithm 1's walk: how many drafts of the path to admit, given their survivals in path order."""
    # each anchor is one token: τ = R at B = R
    tau, best, n_admit = float(requests), requests * profile.sps(requests), 0
    for n, gain in enumerate(gains, start=1):
        tau += gain
        theta = tau * profile.sps(requests + n)
        if theta > best:
            best, n_admit = theta, n
        elif early_stop:
            break
    return n_admit


def prefix_schedule(
    survivals: torch.Tensor,
    profile: ThroughputProfile,
    early_stop: bool = True,
    budget: int | None = None,
) -> torch.Tensor:
    """Algorithm 1: (R, γ) survivals -> (R,) verify lengths; `budget`=K admits exactly the path's top K."""
    R, gamma = survivals.shape
    lengths = torch.zeros(R, dtype=torch.long, device=survivals.device)
    if R == 0 or gamma == 0:
        return lengths
    path = greedy_path(survivals)  # (R·γ, 2)
    if budget is not None:
        n_admit = max(0, min(int(budget), len(path)))
    else:
        # host sync: the walk runs in Python (the Triton kernel walks on the device)
        gains = survivals[path[:, 0], path[:, 1]].tolist()
        n_admit = admitted_count(gains, R, profile, early_stop)
    admitted = path[:n_admit]
    lengths.index_add_(0, admitted[:, 0], torch.ones(n_admit, dtype=torch.long, device=lengths.device))
    return lengths


def expected_rate(survivals: torch.Tensor, lengths: torch.Tensor, profile: ThroughputProfile) -> float:
    """Θ(ℓ) = (Σ_r 1 + Σ_{j<=ℓ_r} a_{r,j}) · SPS(Σ_r 1 + ℓ_r) for any verify lengths."""
    R, gamma = survivals.shape
    keep = torch.arange(gamma, device=survivals.device)[None, :] < lengths[:, None]
    tau = R + float((survivals * keep).sum())
    return tau * profile.sps(R + int(lengths.sum())) if R else 0.0


# ---- policies -------------------------------------------------------------------------------------
class Policy:
    """Verify lengths from this round's (R, γ) survivals and the past; `observe` hears each outcome."""

    name = "policy"
    needs_confidence = False

    def lengths(self, survivals: torch.Tensor, profile: ThroughputProfile) -> torch.Tensor:
        """(R,) verify lengths."""
        raise NotImplementedError

    def observe(self, verify_lens: torch.Tensor, accepted: torch.Tensor) -> None:
        """Called after verification (default: nothing to learn)."""


class FixedPolicy(Policy):
    """`none` (0), `mtp1` (1) or `fixed` (γ) drafts per request, whatever the drafter says."""

    def __init__(self, name: str, length: int | None) -> None:
        self.name, self.length = name, length

    def lengths(self, survivals, profile):
        R, gamma = survivals.shape
        n = gamma if self.length is None else min(self.length, gamma)
        return torch.full((R,), n, dtype=torch.long, device=survivals.device)


class ThresholdPolicy(Policy):
    """Verify the longest prefix whose survival is at least θ."""

    name, needs_confidence = "threshold", True

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def lengths(self, survivals, profile):
        return (survivals >= self.threshold).long().cumprod(dim=1).sum(dim=1)


class GoodputPolicy(Policy):
    """SmartSpec: one EMA acceptance rate α, k = argmax_k R·(1 − α^{k+1})/(1 − α) · SPS(R·(k+1)) for all."""

    name = "goodput"

    def __init__(self, alpha: float = 0.5, decay: float = 0.9) -> None:
        self.alpha, self.decay = alpha, decay

    def lengths(self, survivals, profile):
        R, gamma = survivals.shape
        a = min(self.alpha, 1 - 1e-9)

        def rate(k: int) -> float:  # tokens per second if every request verifies k (no requests: 0)
            return R * (1 - a ** (k + 1)) / (1 - a) * profile.sps(max(1, R * (k + 1)))

        k = max(range(gamma + 1), key=rate)
        return torch.full((R,), k, dtype=torch.long, device=survivals.device)

    def observe(self, verify_lens, accepted):
        # host sync: α is a Python number that picks k on the host
        verified, hits = torch.stack([verify_lens.sum(), accepted.sum()]).tolist()
        if verified:
            self.alpha = self.decay * self.alpha + (1 - self.decay) * hits / verified


class PrefixPolicy(Policy):
    """DSpark's Algorithm 1 with the early stop (lossless); `Scheduler` runs it on the device kernel where
    one fits."""

    name, needs_confidence = "dspark", True
    lengths = staticmethod(prefix_schedule)  # (survivals, profile) -> (R,): Algorithm 1 itself


class AsyncPrefixPolicy(Policy):
    """K from the global argmax over survivals `lag` rounds old (rescaled to R), then the current top K,
    at least `min_length` each; Algorithm 1 until that history exists."""

    name, needs_confidence = "dspark-async", True

    def __init__(self, min_length: int = 0, lag: int = 2) -> None:
        self.min_length, self.lag = min_length, lag
        self.history: deque[tuple[torch.Tensor, ThroughputProfile]] = deque(maxlen=lag)

    def lengths(self, survivals, profile):
        R, gamma = survivals.shape
        if len(self.history) < self.lag:
            lengths = prefix_schedule(survivals, profile)
        else:
            old, old_profile = self.history[0]
            # host sync: K is a Python number
            admitted = prefix_schedule(old, old_profile, early_stop=False).sum().tolist()
            K = round(admitted * R / max(1, old.shape[0]))
            m = min(self.min_length, gamma)
            lengths = torch.full((R,), m, dtype=torch.long, device=survivals.device)
            if m < gamma:
                lengths += prefix_schedule(survivals[:, m:], profile, budget=max(0, K - R * m))
        self.history.append((survivals.clone(), profile))
        return lengths


def make_policy(name: str, threshold: float = 0.5, min_length: int = 0) -> Policy:
    """A fresh policy by its CLI name (see POLICY_NAMES)."""
    fixed = {"none": 0, "mtp1": 1, "fixed": None}  # drafts per request, whatever the drafter says (None: γ)
    if name in fixed:
        return FixedPolicy(name, fixed[name])
    if name == "threshold":
        return ThresholdPolicy(threshold)
    if name == "dspark-async":
        return AsyncPrefixPolicy(min_length)
    if name in ("goodput", "dspark"):
        return GoodputPolicy() if name == "goodput" else PrefixPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


# ---- the engine's scheduler -----------------------------------------------------------------------
class Scheduler:
    """What the engine asks each round: how many drafts each request verifies (`__call__`); `observe` hears
    the outcome. `sts`: the drafter's STS pair, (γ',) temperatures or (2, γ') temperatures and offsets."""

    def __init__(self, policy: Policy, profile: ThroughputProfile, sts: torch.Tensor | None = None) -> None:
        self.policy, self.profile, self.sts = policy, profile, sts

    @classmethod
    def for_drafter(
        cls, policy: Policy, drafter: Drafter, profile: ThroughputProfile, *args, **kwargs
    ) -> Scheduler:
        """Bind `policy` for `drafter`, refusing up front a confidence-ranked policy without a head."""
        if policy.needs_confidence and not drafter.has_confidence:
            raise ValueError(
                f"policy {policy.name!r} ranks drafts by confidence, but the {drafter.name!r} drafter has no "
                "trained confidence head; use dspark or dspark-rnn, or a policy that ignores confidences "
                "(none, mtp1, fixed, goodput)"
            )
        return cls(policy, profile, *args, **kwargs)

    def confidences(self, proposal: Proposal) -> torch.Tensor:
        """(R, γ) confidences; ones without a head (blind policies only: `for_drafter` refuses the rest)."""
        conf = proposal.confidence
        return torch.ones(proposal.tokens.shape, device=proposal.tokens.device) if conf is None else conf

    def __call__(self, proposal: Proposal) -> torch.Tensor:
        """(R,) verify lengths for this round's proposal: the policy's on the calibrated survivals, or for
        Algorithm 1 the Triton kernel where it may run and fits one tile (it calibrates on the device)."""
        conf = self.confidences(proposal)  # (R, γ)
        if isinstance(self.policy, PrefixPolicy) and use_kernel(conf):
            from dspark_kernels import prefix_scheduler  # imports Triton: only when a kernel may run

            if prefix_scheduler.fits(*conf.shape):
                sts = None if self.sts is None else self.sts.to(conf.device, torch.float32).contiguous()
                table = self.profile.table(conf.device)  # (M,)
                return prefix_scheduler.prefix_schedule_triton(conf.float().contiguous(), sts, table)
        return self.policy.lengths(prefix_survival(conf, self.sts), self.profile)

    def observe(self, verify_lens: torch.Tensor, accepted: torch.Tensor) -> None:
        """This round's verify lengths and accepted counts (policies that learn from history)."""
        self.policy.observe(verify_lens, accepted)
