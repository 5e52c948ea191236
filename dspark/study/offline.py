"""The offline study of the DSpark drafter at this project's scale (paper section 4.2-4.3).

Measurements behind `python -m dspark.bench offline|depth|gamma|threshold`, on
the held-out prompts of each domain (their figures: dspark/study/plots.py):

  * position-wise conditional acceptance (paper Fig. 2) over the rows of
    `bench offline`, which also gives the Table 1 analogue;
  * drafter depth (Fig. 3): `measure_tau` for drafters with 1, 2, ... layers;
  * proposal length (Fig. 4): `measure_tau` at several verify lengths of a
    drafter trained with a long block, and `round_latency` -- one drafting
    pass + one target verification pass at a given batch -- with and without
    the sequential head;
  * static confidence-threshold sweep (Fig. 5): `threshold_sweep` replays
    fully verified rounds. With lossless verification a round that verifies
    ℓ drafts accepts min(ℓ, a) of them, where a is what full verification
    accepted (position k's accept/reject never depends on later positions),
    so one recorded run answers every threshold.

A threshold θ verifies the longest prefix whose *survival* Π_{j<=k} c_j is at
least θ (θ = 0: everything) -- the quantity the prefix scheduler ranks (dspark/scheduling/scheduler.py).

What this file does not do: train drafters (`dspark.train drafter`), time
single-stream speed-ups (`bench offline`), or calibrate confidences.
"""

from __future__ import annotations

import statistics
import time

import torch

from dspark.data.corpus import eval_prompts_by_domain
from dspark.data.tokenizer import Tokenizer
from dspark.drafters.base import Drafter, TargetFeatures
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.serving.rounds import RoundStats
from dspark.serving.speculative import speculative_generate


def prompts_by_domain(
    tokenizer: Tokenizer, per_domain: int, start: int = 0, context: int | None = None
) -> dict[str, list[list[int]]]:
    """Held-out chat prompts (token ids) per domain, numbers start .. start+per_domain-1 of
    each domain's eval prompts: the same ones for every drafter. With `context`, prompts
    that leave no room to generate in it are left out."""
    groups = eval_prompts_by_domain(start + per_domain).items()
    ids = {d: [tokenizer.chat_prompt(t) for t in texts[start:]] for d, texts in groups}
    return {d: [p for p in ps if context is None or len(p) < context] for d, ps in ids.items()}


def measure_tau(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    gamma: int,
    max_new_tokens: int,
    eos_id: int | None,
    verify_len: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
) -> RoundStats:
    """Speculative decoding of `prompts` in batches; the drafter proposes `gamma`
    tokens per round and every round verifies `verify_len` of them (default: all)."""
    rounds = RoundStats()
    fixed = None
    if verify_len is not None:
        if not 0 <= verify_len <= gamma:
            raise ValueError(f"verify_len must be in 0..{gamma}")
        fixed = lambda proposal: torch.full((proposal.tokens.shape[0],), verify_len)  # noqa: E731
    for start in range(0, len(prompts), batch_size):
        result = speculative_generate(target, drafter, prompts[start : start + batch_size], max_new_tokens,
                                      params, gamma, torch.Generator().manual_seed(seed + start), eos_id,
                                      fixed)  # fmt: skip
        rounds.extend(result.stats)
    return rounds


def threshold_sweep(rounds: RoundStats, thresholds: list[float]) -> list[dict]:
    """Replay fully verified rounds under static survival thresholds.

    For each θ: ℓ = number of leading positions with Π_{j<=k} c_j >= θ,
    accepted = min(ℓ, a), rejected = ℓ - accepted; reported per round (step)
    together with the acceptance rate accepted / verified."""
    flat = [(ell, a, c) for L, A, C in zip(rounds.verify_lens, rounds.accepted, rounds.confidences)
            for ell, a, c in zip(L, A, C)]  # fmt: skip
    if not flat:
        raise ValueError("no rounds with confidences to replay (does the drafter have a confidence head?)")
    if any(ell != len(c) for ell, _, c in flat):
        raise ValueError("threshold_sweep needs fully verified rounds (ℓ = γ in every round)")
    survivals = [torch.tensor(c, dtype=torch.float64).cumprod(0) for _, _, c in flat]
    rows = []
    for theta in thresholds:
        acc = rej = 0
        for (_, a, _), surv in zip(flat, survivals):
            below = (surv < theta).nonzero()
            ell = int(below[0]) if len(below) else len(surv)
            acc += min(ell, a)
            rej += ell - min(ell, a)
        n = len(flat)
        rows.append({"threshold": theta, "accepted_per_step": acc / n, "rejected_per_step": rej / n,
                     "acceptance_rate": acc / (acc + rej) if acc + rej else None})  # fmt: skip
    return rows


@torch.no_grad()
def round_latency(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    gamma: int,
    params: SamplingParams,
    repeats: int = 20,
) -> dict:
    """Median wall-clock of one speculative round for a batch of requests:
    drafting γ tokens each (`propose`) + one ragged target pass over
    anchor + γ drafts each. The caches are rolled back after every round so
    every repeat sees the same contexts. Parallel drafters only (their
    context cache accepts a round that commits nothing)."""
    from dspark.drafters.parallel import ParallelDrafter

    if not isinstance(drafter, ParallelDrafter):
        raise ValueError(f"round_latency times the parallel drafters (dflash, dspark*), not {drafter.name!r}")
    n = len(prompts)
    cache = target.new_cache(n)
    drafter.reset(cache.n_slots)
    slots = torch.tensor([cache.allocate() for _ in prompts])
    lens = torch.tensor([len(p) for p in prompts])
    flat = torch.tensor([t for p in prompts for t in p])
    res = target.forward_cached(flat, slots, lens, cache, return_taps=True)
    anchors = sample(probabilities(res.logits[torch.cumsum(lens, 0) - 1], params), torch.Generator())
    generator = torch.Generator().manual_seed(0)
    features, committed, committed_lens = TargetFeatures(res.taps, res.last_hidden), flat, lens
    draft_ms, verify_ms = [], []
    start = cache.lengths[slots].clone()
    for rep in range(repeats + 1):  # the first round is a warm-up (and appends the prompt context)
        t0 = time.perf_counter()
        drafts = drafter.propose(
            slots, committed, features, committed_lens, anchors, gamma, params, generator
        ).tokens
        t1 = time.perf_counter()
        blocks = torch.cat([anchors[:, None], drafts], dim=1).flatten()
        target.forward_cached(blocks, slots, torch.full((n,), gamma + 1), cache, return_taps=True)
        t2 = time.perf_counter()
        for s, length in zip(slots.tolist(), start.tolist()):
            cache.rollback(s, length)
        # nothing new is committed, so later rounds append no context to the drafter
        committed, committed_lens = flat[:0], torch.zeros(n, dtype=torch.long)
        features = TargetFeatures(features.taps[:0], features.last_hidden[:0])
        if rep:
            draft_ms.append(1000 * (t1 - t0))
            verify_ms.append(1000 * (t2 - t1))
    draft, verify = statistics.median(draft_ms), statistics.median(verify_ms)
    return {"batch": n, "gamma": gamma, "draft_ms": draft, "verify_ms": verify, "round_ms": draft + verify}


def macro(values: list[float]) -> float:
    return sum(values) / len(values)


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
