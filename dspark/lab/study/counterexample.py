"""Paper Appendix A, run through the project's real rejection sampler and schedulers.

One request, γ = 2, vocabulary {A, B}. The target wants the first token with
p_t = (0.7, 0.3); the drafter samples it from p_d = (0.5, 0.5), so the first
draft survives with a_1 = Σ min(p_t, p_d) = 0.8. The Markov confidence of the
second position depends on the drafted token: c_2 = 0.9 after A, 0 after B.
SPS(1..3) = 1.0, 0.5, 0.45.

  * retrospective (global argmax, no early stop): Θ = 1.0, 0.9, then 1.134
    after A (admit both) but 0.81 after B (admit none), so whether x_1 is
    verified depends on x_1 itself: the first output token follows
    (0.85, 0.15), not the target's (0.7, 0.3);
  * Algorithm 1 (early stop): Θ_1 = 0.9 < Θ_0 = 1.0, stop, ℓ = 0 always;
  * asynchronous: the budget K comes from the survivals of the round two
    draws earlier, so it cannot depend on the current x_1.

Every draw is one independent round with fresh uniforms; `verify` decides.
What this file does not do: anything else -- it is the experiment behind
`python -m dspark.bench appendix-a` and a test.
"""

from __future__ import annotations

import torch

from dspark.sampling import sample_from_probs
from dspark.scheduler import AsyncPrefixPolicy, ThroughputProfile, prefix_schedule
from dspark.verify import verify

TARGET = (0.7, 0.3)  # p_t of the first token over {A, B}
DRAFT = (0.5, 0.5)  # p_d of the first draft
FIRST_CONFIDENCE = 0.8  # c_1 = a_1 = Σ min(p_t, p_d)
SECOND_CONFIDENCE = {0: 0.9, 1: 0.0}  # c_2 given x_1 = A (0) or B (1)
PROFILE = ThroughputProfile([1.0, 0.5, 0.45], "appendix-a")


def counterexample(draws: int, seed: int = 0) -> dict:
    """First-output-token frequencies of (A, B) under each scheduler."""
    if draws < 3:
        raise ValueError("need at least 3 draws (the asynchronous scheduler looks two draws back)")
    g = torch.Generator().manual_seed(seed)
    p_t, p_d = torch.tensor(TARGET), torch.tensor(DRAFT)
    drafts = sample_from_probs(p_d.expand(draws, 2, 2), torch.rand(draws, 2, generator=g))  # (N, γ)
    c2 = torch.tensor([SECOND_CONFIDENCE[int(x)] for x in drafts[:, 0]])
    survivals = torch.stack([torch.full((draws,), FIRST_CONFIDENCE), FIRST_CONFIDENCE * c2], dim=1).double()

    lengths = {"retrospective": [], "early_stop": [], "async": []}
    policy = AsyncPrefixPolicy()
    for i in range(draws):
        a = survivals[i : i + 1]  # (R=1, γ=2)
        lengths["retrospective"].append(int(prefix_schedule(a, PROFILE, early_stop=False)[0]))
        lengths["early_stop"].append(int(prefix_schedule(a, PROFILE, early_stop=True)[0]))
        lengths["async"].append(int(policy.lengths(a, PROFILE)[0]))

    draft_probs = p_d.expand(draws, 2, 2)
    target_probs = p_t.expand(draws, 3, 2)  # the same law at every position (only the first matters)
    accept_u, resample_u = torch.rand(draws, 2, generator=g), torch.rand(draws, generator=g)
    out: dict = {"target": list(TARGET)}
    for name, ells in lengths.items():
        # the same draws and uniforms for every scheduler: only the verify lengths differ
        result = verify(drafts, draft_probs, target_probs, torch.tensor(ells), accept_u, resample_u)
        first = torch.where(result.accepted > 0, drafts[:, 0], result.next_token)
        freq = torch.bincount(first, minlength=2).double() / draws
        out[name] = [round(float(f), 4) for f in freq]
        out[f"{name}_mean_verify_len"] = sum(ells) / draws
    out["draws"] = draws
    return out
