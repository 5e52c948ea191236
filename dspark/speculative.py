"""The speculative generation loop: draft -> one ragged target pass -> verify -> roll back.

For a batch of prompts (different lengths, each in its own KV-cache slot):

  1. prefill every prompt in one ragged target pass, sample the first token
     (the first *anchor*) from the target;
  2. each round: the drafter proposes γ tokens after each request's anchor;
     request r sends its anchor + the first ℓ_r drafts to the target (ℓ_r is
     γ here, capped by the context; the scheduler issue makes it a policy);
     ONE target pass scores all requests' blocks; `verify` accepts a_r drafts
     and samples the replacement/bonus token, the next anchor;
  3. the target cache is rolled back to keep anchor + accepted drafts; the
     drafter receives those committed positions with the target's features
     and rolls back its own state;
  4. emitted tokens stop at EOS and at exactly `max_new_tokens`, even when the
     limit falls inside a block; finished requests free their slots.

With `NoDrafter` (γ = 0) this is plain decoding. At temperature 0 the output
is token-identical to `generation.generate` for every drafter (the tests check
it); at T > 0 it follows the target's distribution exactly.

What this file does not do: choose verify lengths cleverly (scheduler issue)
or admit requests over time (serving engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.drafters.base import Drafter, TargetFeatures
from dspark.generation import GenerationResult, check_prompts
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.verify import draw_uniforms, verify


@dataclass
class SpeculativeResult(GenerationResult):
    from_draft: list[list[bool]] = field(default_factory=list)  # per emitted token: was it an accepted draft?
    verify_lens: list[list[int]] = field(default_factory=list)  # per request, per round: ℓ_r
    accepted: list[list[int]] = field(default_factory=list)  # per request, per round: a_r
    # per request, per round: the drafter's confidences c_1..c_γ (empty lists if it has no confidence head)
    confidences: list[list[list[float]]] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return sum(len(a) for a in self.accepted)

    @property
    def tau(self) -> float:
        return tokens_per_round(self.accepted)

    def acceptance_by_position(self, gamma: int) -> list[float | None]:
        return acceptance_by_position(self.verify_lens, self.accepted, gamma)


def tokens_per_round(accepted: list[list[int]]) -> float:
    """τ: mean tokens per request-round, the bonus/correction token included."""
    rounds = [a for acc in accepted for a in acc]
    return sum(a + 1 for a in rounds) / max(1, len(rounds))


def acceptance_by_position(
    verify_lens: list[list[int]], accepted: list[list[int]], gamma: int
) -> list[float | None]:
    """Position-wise conditional acceptance (DESIGN section 7): at position k,
    among rounds that verified k and accepted 1..k-1, the fraction accepting k."""
    hits, tries = [0] * gamma, [0] * gamma
    for lens, accs in zip(verify_lens, accepted):
        for ell, a in zip(lens, accs):
            for k in range(min(ell, a + 1)):  # positions 1..min(ℓ, a+1) were reached
                tries[k] += 1
                hits[k] += k < a
    return [h / t if t else None for h, t in zip(hits, tries)]


@torch.no_grad()
def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    gamma: int,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    verify_len_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    observe_fn: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> SpeculativeResult:
    """Generate for every prompt with `drafter` proposing `gamma` tokens per round.

    `verify_len_fn(draft_tokens (R, γ), draft_probs (R, γ, V)) -> (R,)` picks how
    many drafts each request verifies (default: all γ); it must depend on
    nothing but what the drafter produced, or losslessness is lost.
    `observe_fn(verify_lens (R,), accepted (R,))` hears every round's outcome
    (policies that learn from history, dspark/scheduler.py)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 <= gamma <= drafter.max_gamma:
        raise ValueError(f"gamma must be in 0..{drafter.max_gamma} for drafter {drafter.name!r}")
    context = target.config.max_seq_len
    check_prompts(prompts, context)
    generator = generator or torch.Generator().manual_seed(0)
    n = len(prompts)
    cache = target.new_cache(n)
    drafter.reset(cache.n_slots)
    slots = torch.tensor([cache.allocate() for _ in prompts])
    limit = [min(max_new_tokens, context - len(p) + 1) for p in prompts]  # as plain decoding
    out: list[list[int]] = [[] for _ in prompts]
    from_draft: list[list[bool]] = [[] for _ in prompts]
    reasons = [""] * n
    ells: list[list[int]] = [[] for _ in prompts]
    accs: list[list[int]] = [[] for _ in prompts]
    confs: list[list[list[float]]] = [[] for _ in prompts]

    def emit(i: int, tokens: list[int], drafted: list[bool]) -> bool:
        """Append tokens to request i until a stop; True if the request is finished."""
        for token, is_draft in zip(tokens, drafted):
            out[i].append(token)
            from_draft[i].append(is_draft)
            if eos_id is not None and token == eos_id:
                reasons[i] = "eos"
            elif len(out[i]) >= limit[i]:
                reasons[i] = "length" if len(out[i]) >= max_new_tokens else "context"
            if reasons[i]:
                return True
        return False

    t0 = time.perf_counter()
    lens = torch.tensor([len(p) for p in prompts])
    committed = torch.tensor([t for p in prompts for t in p])
    res = target.forward_cached(committed, slots, lens, cache, return_taps=True)
    last = torch.cumsum(lens, 0) - 1
    anchors = sample(probabilities(res.logits[last], params), generator)
    features = TargetFeatures(res.taps, res.last_hidden)
    active = [i for i in range(n) if not emit(i, [int(anchors[i])], [False])]
    prefill_seconds = time.perf_counter() - t0

    t1, steps = time.perf_counter(), 0
    keep = torch.tensor([i in active for i in range(n)])
    committed, features, lens, anchors = _select(committed, features, lens, anchors, keep)
    for i in range(n):
        if i not in active:
            cache.free(int(slots[i]))
            drafter.release(int(slots[i]))
    while active:
        act_slots = slots[active]
        drafts, draft_probs = drafter.propose(
            act_slots, committed, features, lens, anchors, gamma, params, generator
        )
        round_conf = getattr(drafter, "last_confidence", None)  # (R, γ) or None
        room = context - cache.lengths[act_slots] - 1  # positions left after the anchor
        wanted = verify_len_fn(drafts, draft_probs) if verify_len_fn else torch.full_like(room, gamma)
        if bool(((wanted < 0) | (wanted > gamma)).any()):
            raise ValueError(f"verify lengths must be in 0..{gamma}")
        verify_lens = torch.minimum(wanted, room)  # (R,)
        blocks = [
            torch.cat([anchors[r : r + 1], drafts[r, : int(verify_lens[r])]]) for r in range(len(active))
        ]
        block_lens = verify_lens + 1
        start = cache.lengths[act_slots].clone()
        res = target.forward_cached(torch.cat(blocks), act_slots, block_lens, cache, return_taps=True)
        steps += 1
        target_probs = torch.zeros(len(active), gamma + 1, target.config.vocab_size)
        for r, p in enumerate(probabilities(res.logits, params).split(block_lens.tolist())):
            target_probs[r, : p.shape[0]] = p
        result = verify(
            drafts, draft_probs, target_probs, verify_lens, *draw_uniforms(len(active), gamma, generator)
        )

        if observe_fn is not None:
            observe_fn(verify_lens, result.accepted)
        kept_lens = result.accepted + 1  # anchor + accepted drafts stay in the cache
        flat_keep = torch.cat(
            [torch.arange(int(b)) < int(k) for b, k in zip(block_lens, kept_lens)]
        )  # (N,) mask over the block tokens
        still = []
        for r, i in enumerate(active):
            a = int(result.accepted[r])
            ells[i].append(int(verify_lens[r]))
            accs[i].append(a)
            if round_conf is not None:
                confs[i].append(round_conf[r].tolist())
            cache.rollback(int(act_slots[r]), int(start[r]) + a + 1)
            new = [*drafts[r, :a].tolist(), int(result.next_token[r])]
            if emit(i, new, [True] * a + [False]):
                cache.free(int(act_slots[r]))
                drafter.release(int(act_slots[r]))
            else:
                still.append(r)
        keep_rows = torch.zeros(len(active), dtype=torch.bool)
        keep_rows[still] = True
        committed = torch.cat(blocks)[flat_keep]
        features = TargetFeatures(res.taps[flat_keep], res.last_hidden[flat_keep])
        committed, features, lens, anchors = _select(
            committed, features, kept_lens, result.next_token, keep_rows
        )
        active = [active[r] for r in still]
    decode_seconds = time.perf_counter() - t1
    return SpeculativeResult(
        out, reasons, prefill_seconds, decode_seconds, steps, from_draft, ells, accs, confs
    )


def _select(tokens, features: TargetFeatures, lens, anchors, keep_rows):
    """Keep only the requests in `keep_rows` (R,) bool: flat tokens/features and per-row tensors."""
    flat = torch.repeat_interleave(keep_rows, lens)
    feats = TargetFeatures(features.taps[flat], features.last_hidden[flat])
    return tokens[flat], feats, lens[keep_rows], anchors[keep_rows]
