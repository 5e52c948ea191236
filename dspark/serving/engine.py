"""A continuous-batching speculative serving engine (walkthrough/DESIGN.md section 6, paper section 5).

Requests wait in a queue. The engine keeps at most `concurrency` of them
active, each in its own KV-cache slot; every step it

  1. admits waiting requests while slots are free (closed loop: as soon as
     one finishes; Poisson mode: once their arrival time has passed),
     rejecting bad ones (empty, too long for the context, nothing to
     generate) individually, and prefills the admitted prompts in ONE ragged
     target pass whose last logits give each request its first token;
  2. lets the drafter propose γ tokens after every active request's anchor
     (it first appends the context that was committed since its last call):
     one `Proposal` of tokens, their distributions q and, if the drafter has
     a trained head, confidences;
  3. hands that Proposal to the verify-length function (a `VerifyScheduler`,
     dspark/scheduling/scheduler.py) for ℓ_r per request, capped by the
     context left;
  4. runs ONE ragged target pass over every request's anchor + ℓ_r drafts --
     flattened tokens with request ids, no padding -- and `verify`s them;
  5. rolls every target cache back to anchor + accepted drafts, emits the
     accepted drafts + the correction/bonus token, stops requests at EOS,
     `max_new_tokens` or the context, frees their slots for reuse.

With a `NoDrafter` (γ = 0) it is plain continuous-batching decoding. Per
request it records the time to first token, the end-to-end time and every
round's verify length, accepted count and confidences; the result has the
global throughput and the round statistics (`EngineResult.stats`,
dspark/serving/rounds.py). `speculative_generate` (dspark/serving/speculative.py) is this
engine with every prompt admitted at once.

What this file does not do: choose verify lengths (policies) or simulate a GPU
(the trace-driven simulator).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.serving.rounds import RoundStats
from dspark.verify import draw_uniforms, verify


@dataclass
class Request:
    prompt: list[int]  # token ids
    max_new_tokens: int  # generation budget
    arrival: float = 0.0  # seconds after the start (Poisson mode; 0 = already waiting)


@dataclass
class RequestRecord:
    tokens: list[int] = field(default_factory=list)  # emitted tokens (EOS included when it ended it)
    from_draft: list[bool] = field(default_factory=list)  # per token: an accepted draft?
    verify_lens: list[int] = field(default_factory=list)  # per round: ℓ
    accepted: list[int] = field(default_factory=list)  # per round: accepted drafts a
    emitted: list[int] = field(default_factory=list)  # per round: tokens committed (a + 1, fewer at a stop)
    confidences: list[list[float]] = field(default_factory=list)  # per round: c_1..c_γ (if it has them)
    stop_reason: str = ""  # "eos", "length", "context", or "rejected"
    error: str = ""  # why a request was rejected
    submitted: float = 0.0  # seconds after the start: admitted to the queue's head (closed loop) or arrived
    first_token: float = 0.0  # when the first token was emitted
    finished: float = 0.0  # when the last token was emitted

    @property
    def ttft(self) -> float:
        return self.first_token - self.submitted

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, (E2E - TTFT) / (n - 1)."""
        n = len(self.tokens)
        return (self.finished - self.first_token) / (n - 1) if n > 1 else None


@dataclass
class EngineResult:
    records: list[RequestRecord]  # one per request, in submission order
    seconds: float  # wall time of the whole run
    prefill_seconds: float  # spent in prefill passes
    steps: int  # speculative steps (one target verification pass each)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.records)

    @property
    def stats(self) -> RoundStats:
        """Every request's rounds (ℓ, accepted, confidences), in submission order."""
        recs = self.records
        return RoundStats([r.verify_lens for r in recs], [r.accepted for r in recs], [r.confidences for r in recs],
                          [r.emitted for r in recs])  # fmt: skip

    @property
    def throughput(self) -> float:
        """Output tokens per second over all requests."""
        return self.output_tokens / self.seconds if self.seconds > 0 else float("nan")


class Engine:
    def __init__(
        self,
        target: Transformer,
        drafter: Drafter,
        params: SamplingParams,
        gamma: int,
        concurrency: int,
        eos_id: int | None = None,
        verify_len_fn: Callable[[Proposal], torch.Tensor] | None = None,
        observe_fn: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    ) -> None:
        """`verify_len_fn(proposal) -> (R,)` picks ℓ_r (default: all γ), e.g. a
        `VerifyScheduler`; it must depend only on the proposal and earlier rounds, or
        losslessness is lost. `observe_fn(verify_lens, accepted)` hears each step's
        outcome (a VerifyScheduler's `observe`)."""
        if not 0 <= gamma <= drafter.max_gamma:
            raise ValueError(f"gamma must be in 0..{drafter.max_gamma} for drafter {drafter.name!r}")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.target, self.drafter, self.params, self.gamma = target, drafter, params, gamma
        self.concurrency, self.eos_id = concurrency, eos_id
        self.verify_len_fn, self.observe_fn = verify_len_fn, observe_fn
        self.cache = target.new_cache(concurrency)
        self.drafter.reset(self.cache.n_slots)

    def rejection(self, request: Request) -> str:
        context = self.target.config.max_seq_len
        if len(request.prompt) == 0:
            return "empty prompt"
        if len(request.prompt) >= context:
            return f"prompt of {len(request.prompt)} tokens leaves no room in the {context}-token context"
        if request.max_new_tokens < 1:
            return "max_new_tokens must be >= 1"
        return ""

    @torch.no_grad()
    def run(
        self,
        requests: list[Request],
        generator: torch.Generator | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> EngineResult:
        """Serve `requests` to completion; `progress(n)` is called as n more requests finish."""
        generator = generator or torch.Generator().manual_seed(0)
        target, drafter, cache, gamma = self.target, self.drafter, self.cache, self.gamma
        context = target.config.max_seq_len
        records = [RequestRecord() for _ in requests]
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        queue = deque(order)
        # per active request: slot, anchor, and the tokens/features committed since the drafter's last call
        active: list[int] = []
        slot_of, anchor_of, limit_of = {}, {}, {}
        pending: dict[int, tuple[torch.Tensor, TargetFeatures]] = {}
        start, prefill_seconds, steps = time.perf_counter(), 0.0, 0

        def now() -> float:
            return time.perf_counter() - start

        def emit(i: int, tokens: list[int], drafted: list[bool]) -> bool:
            """Append tokens to request i until a stop rule fires; True if it finished."""
            rec = records[i]
            for token, is_draft in zip(tokens, drafted):
                rec.tokens.append(token)
                rec.from_draft.append(is_draft)
                if self.eos_id is not None and token == self.eos_id:
                    rec.stop_reason = "eos"
                elif len(rec.tokens) >= limit_of[i]:
                    rec.stop_reason = "length" if len(rec.tokens) >= requests[i].max_new_tokens else "context"
                if rec.stop_reason:
                    rec.finished = now()
                    return True
            return False

        def finish(i: int) -> None:
            cache.free(slot_of[i])
            drafter.release(slot_of[i])
            pending.pop(i, None)
            if progress:
                progress(1)

        while queue or active:
            # 1. admission + one ragged prefill pass for the newcomers
            admitted = []
            while queue and len(active) + len(admitted) < self.concurrency:
                if requests[queue[0]].arrival > now():
                    break
                i = queue.popleft()
                records[i].submitted = requests[i].arrival if requests[i].arrival else now()
                reason = self.rejection(requests[i])
                if reason:
                    records[i].stop_reason, records[i].error = "rejected", reason
                    if progress:
                        progress(1)
                    continue
                slot_of[i] = cache.allocate()
                limit_of[i] = min(requests[i].max_new_tokens, context - len(requests[i].prompt) + 1)
                admitted.append(i)
            if admitted:
                t0 = time.perf_counter()
                lens = torch.tensor([len(requests[i].prompt) for i in admitted])
                flat = torch.tensor([t for i in admitted for t in requests[i].prompt])
                slots = torch.tensor([slot_of[i] for i in admitted])
                res = target.forward_cached(flat, slots, lens, cache, return_taps=True)
                first = sample(probabilities(res.logits[torch.cumsum(lens, 0) - 1], self.params), generator)
                feats = TargetFeatures(res.taps, res.last_hidden).split(lens.tolist())
                for row, (i, toks) in enumerate(zip(admitted, flat.split(lens.tolist()))):
                    records[i].first_token = now()
                    anchor_of[i] = int(first[row])
                    if emit(i, [anchor_of[i]], [False]):
                        finish(i)
                    else:
                        pending[i] = (toks, feats[row])
                        active.append(i)
                prefill_seconds += time.perf_counter() - t0
            if not active:
                if queue:  # Poisson mode: idle until the next arrival
                    time.sleep(max(0.0, requests[queue[0]].arrival - now()))
                continue

            # 2. draft
            slots = torch.tensor([slot_of[i] for i in active])
            anchors = torch.tensor([anchor_of[i] for i in active])
            committed = torch.cat([pending[i][0] for i in active])
            lens = torch.tensor([len(pending[i][0]) for i in active])
            features = TargetFeatures(torch.cat([pending[i][1].taps for i in active]),
                                      torch.cat([pending[i][1].last_hidden for i in active]))  # fmt: skip
            proposal = drafter.propose(
                slots, committed, features, lens, anchors, gamma, self.params, generator
            )
            drafts, round_conf = proposal.tokens, proposal.confidence  # (R, γ), (R, γ) or None

            # 3. verify lengths, capped by the context left after the anchor
            room = context - cache.lengths[slots] - 1
            wanted = self.verify_len_fn(proposal) if self.verify_len_fn else torch.full_like(room, gamma)
            if bool(((wanted < 0) | (wanted > gamma)).any()):
                raise ValueError(f"verify lengths must be in 0..{gamma}")
            verify_lens = torch.minimum(wanted.long(), room)  # (R,)

            # 4. one ragged target pass over anchor + ℓ_r drafts of every request, then verify
            block_lens = verify_lens + 1
            keep = torch.arange(gamma + 1)[None, :] < block_lens[:, None]  # (R, γ+1)
            blocks = torch.cat([anchors[:, None], drafts], dim=1)[keep]  # (N,) flat, request-major
            start_len = cache.lengths[slots].clone()
            res = target.forward_cached(blocks, slots, block_lens, cache, return_taps=True)
            steps += 1
            target_probs = torch.zeros(len(active), gamma + 1, target.config.vocab_size)
            target_probs[keep] = probabilities(res.logits, self.params)
            result = verify(drafts, proposal.probs, target_probs, verify_lens,
                            *draw_uniforms(len(active), gamma, generator))  # fmt: skip
            if self.observe_fn is not None:
                self.observe_fn(verify_lens, result.accepted)

            # 5. roll back, emit, commit, finish
            feats = TargetFeatures(res.taps, res.last_hidden).split(block_lens.tolist())
            still = []
            for r, (i, toks) in enumerate(zip(active, blocks.split(block_lens.tolist()))):
                a = int(result.accepted[r])
                rec = records[i]
                rec.verify_lens.append(int(verify_lens[r]))
                rec.accepted.append(a)
                if round_conf is not None:
                    rec.confidences.append(round_conf[r].tolist())
                cache.rollback(slot_of[i], int(start_len[r]) + a + 1)  # anchor + accepted drafts stay
                anchor_of[i] = int(result.next_token[r])
                n_before = len(rec.tokens)
                finished = emit(i, [*drafts[r, :a].tolist(), anchor_of[i]], [True] * a + [False])
                rec.emitted.append(
                    len(rec.tokens) - n_before
                )  # a + 1, or fewer if EOS/the limit cut the round
                if finished:
                    finish(i)
                else:
                    pending[i] = (toks[: a + 1], feats[r].take(a + 1))
                    still.append(i)
            active = still
        return EngineResult(records, now(), prefill_seconds, steps)
