"""A continuous-batching speculative serving engine (DESIGN.md section 6). Each step of `Engine.run`:

    admit + prefill    free slots take arrived requests; ONE ragged pass over their prompts
    draft              the drafter's `Proposal` of γ tokens after every anchor
    verify_round       ℓ_r from the scheduler; ONE ragged pass over anchor + ℓ_r drafts; `verify`; roll back
    commit             emit accepted drafts + the next token; stop at EOS or a limit, free the slot

Tensors live on the target's device; the bookkeeping (slots, anchors, lengths) stays on the host and is
uploaded without waiting, and each step reads the device at a few counted points (`# host sync`).
`speculative_generate` (at the end) runs a batch of prompts through it: at T = 0 token-identical to
`decoding.generate` for every drafter and policy, at T > 0 exactly the target's distribution.
"""

from __future__ import annotations

import math
import numbers
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from dspark.decoding import GenerationResult, check_max_new_tokens, check_prompts, check_token_ids, is_integer
from dspark.device import generator_uniforms, host_syncs, model_device, to_host, upload
from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.model import Transformer
from dspark.requests import ActiveRequest, EngineResult, Request, RequestRecord, RoundRecord, RoundStats
from dspark.sampling import SamplingParams, probabilities, sample_from_probs
from dspark.scheduler import Scheduler
from dspark.verify import draw_uniforms, verify, verify_greedy


@dataclass
class RunState:
    """One `Engine.run`: the queue, the active requests, the clock and the counters."""

    requests: list[Request]
    progress: Callable[[int], None] | None
    records: list[RequestRecord] = field(init=False)
    queue: deque[int] = field(init=False)  # indices into `requests`, by arrival time
    active: list[ActiveRequest] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)
    prefill_seconds: float = 0.0
    prefill_syncs: int = 0
    draft_seconds: float = 0.0
    drafted_rounds: int = 0
    steps: int = 0
    step_syncs: list[int] = field(default_factory=list)  # per step: host reads

    def __post_init__(self) -> None:
        self.records = [RequestRecord() for _ in self.requests]
        self.queue = deque(sorted(range(len(self.requests)), key=lambda i: self.requests[i].arrival))

    def now(self) -> float:
        return time.perf_counter() - self.start

    def done(self) -> None:
        if self.progress:
            self.progress(1)

    def result(self) -> EngineResult:
        times = (self.prefill_seconds, self.steps, self.step_syncs, self.prefill_syncs)
        return EngineResult(self.records, self.now(), *times, self.draft_seconds, self.drafted_rounds)


@dataclass
class Round:
    """One step's target pass as the commit phase reads it (R active requests, N verified tokens)."""

    ells: list[int]  # per request: ℓ, the drafts it verified (0 in a plain decode step)
    block_lens: list[int]  # per request: ℓ + 1, its anchor and the verified drafts
    blocks: torch.Tensor  # (N,) the verified tokens, request-major
    features: TargetFeatures  # of the N positions
    accepted: list[int]  # per request: a, the drafts it accepted
    next_token: list[int]  # per request: the correction or bonus token
    drafts: list[list[int]]  # per request: the g drafted tokens
    confidences: list[list[float]]  # per request: their confidences ([] without a confidence head)


def read_outcome(
    accepted: torch.Tensor, next_token: torch.Tensor, drafts: torch.Tensor, confidence: torch.Tensor | None
) -> tuple[list[int], list[int], list[list[int]], list[list[float]]]:
    """The round's outcome on the host in ONE read (fp64 holds the ids and fp32 confidences exactly):
    (R,) accepted counts and next tokens, (R, g) drafts and confidences."""
    g = drafts.shape[1]
    parts = [
        accepted[:, None],
        next_token[:, None],
        drafts,
        *([confidence] if confidence is not None else []),
    ]
    rows = to_host(torch.cat([t.double() for t in parts], dim=1), "engine: the round's outcome")  # host sync
    ints = [[int(x) for x in row[: 2 + g]] for row in rows]
    return [r[0] for r in ints], [r[1] for r in ints], [r[2:] for r in ints], [row[2 + g :] for row in rows]


class Engine:
    def __init__(
        self,
        target: Transformer,
        drafter: Drafter,
        params: SamplingParams,
        gamma: int,
        concurrency: int,
        eos_id: int | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        """`scheduler` (None: verify all γ) decides each round's ℓ_r; it must depend only on the proposal and
        earlier rounds, or losslessness is lost. Every active request drafts γ (0: plain decode steps)."""
        if not 0 <= gamma <= drafter.max_gamma:
            raise ValueError(f"gamma must be in 0..{drafter.max_gamma} for drafter {drafter.name!r}")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.target, self.drafter, self.params, self.gamma = target, drafter, params, gamma
        self.concurrency, self.eos_id = concurrency, eos_id
        self.scheduler = scheduler
        self.cache = target.new_cache(concurrency)
        self.drafter.reset(self.cache.n_slots)

    def check_requests(self, requests: list[Request]) -> None:
        """ValueError for malformed requests (ids, budget, arrival); servable-but-bad ones are `rejection`s."""
        vocab = self.target.config.vocab_size
        for i, request in enumerate(requests, start=1):
            if not isinstance(request.prompt, (list, tuple)):
                raise ValueError(
                    f"request {i}: the prompt is a {type(request.prompt).__name__}, not a list of ids"
                )
            check_token_ids(request.prompt, vocab, f"request {i}")
            if not is_integer(request.max_new_tokens):
                raise ValueError(
                    f"request {i}: max_new_tokens must be an integer, got {request.max_new_tokens!r}"
                )
            arrival = request.arrival
            seconds = isinstance(arrival, numbers.Real) and not isinstance(arrival, bool)
            if not seconds or not 0 <= arrival < math.inf:
                raise ValueError(
                    f"request {i}: the arrival time must be a finite number of seconds >= 0, got {arrival!r}"
                )

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
        self.check_requests(requests)
        generator = generator or torch.Generator().manual_seed(0)
        run = RunState(requests, progress)
        while run.queue or run.active:
            newcomers = self.admit(run)
            if newcomers:
                self.prefill(run, newcomers, generator)
            if not run.active:
                if run.queue:  # Poisson mode: idle until the next arrival
                    time.sleep(max(0.0, requests[run.queue[0]].arrival - run.now()))
                continue
            syncs_before = host_syncs()
            self.commit(run, self.step(run, generator))
            run.steps += 1
            run.step_syncs.append(host_syncs() - syncs_before)
        return run.result()

    def admit(self, run: RunState) -> list[ActiveRequest]:
        """Arrived requests, in order, while slots are free; a bad one is rejected on its own."""
        newcomers: list[ActiveRequest] = []
        context = self.target.config.max_seq_len
        while run.queue and len(run.active) + len(newcomers) < self.concurrency:
            request = run.requests[run.queue[0]]
            if request.arrival > run.now():
                break
            record = run.records[run.queue.popleft()]
            record.submitted = request.arrival if request.arrival else run.now()
            reason = self.rejection(request)
            if reason:
                record.stop_reason, record.error = "rejected", reason
                run.done()
                continue
            limit = min(request.max_new_tokens, context - len(request.prompt) + 1)
            newcomers.append(ActiveRequest(request, record, self.cache.allocate(), limit))
        return newcomers

    def prefill(self, run: RunState, newcomers: list[ActiveRequest], generator: torch.Generator) -> None:
        """ONE ragged pass over the newcomers' prompts: the last logits give each its anchor; the features
        wait for the drafter's first call."""
        t0, syncs_before, device = time.perf_counter(), host_syncs(), model_device(self.target)
        lens = [len(a.request.prompt) for a in newcomers]
        flat = upload([t for a in newcomers for t in a.request.prompt], device)  # (S·T,)
        slots = upload([a.slot for a in newcomers], device)
        last = upload(list(accumulate(lens)), device) - 1  # (S,) each prompt's last position
        res = self.target.forward_cached(
            flat, slots, upload(lens, device), self.cache, return_taps=True, logits_at=last
        )
        # host sync: the first tokens (emitted, checked for EOS)
        first = to_host(self.target_tokens(res.logits, generator), "engine: first tokens")
        features = TargetFeatures(res.taps, res.last_hidden).split(lens)
        for a, tokens, feats, token, n in zip(newcomers, flat.split(lens), features, first, lens):
            a.record.first_token = run.now()
            a.anchor, a.length = token, n
            if a.emit([token], [False], self.eos_id, run.now()):
                self.finish(run, a)
            else:
                a.pending = (tokens, feats)
                run.active.append(a)
        run.prefill_seconds += time.perf_counter() - t0
        run.prefill_syncs += host_syncs() - syncs_before

    def step(self, run: RunState, generator: torch.Generator) -> Round:
        """Every active request drafts γ tokens and verifies them (γ = 0: the step plain decoding takes)."""
        device = model_device(self.target)
        slots = upload([a.slot for a in run.active], device)  # (R,)
        anchors = upload([a.anchor for a in run.active], device)  # (R,)
        if self.gamma == 0:
            return self.decode_round(slots, anchors, generator)
        t0 = time.perf_counter()
        proposal = self.draft(run.active, slots, anchors, generator, self.gamma)
        run.draft_seconds += time.perf_counter() - t0
        run.drafted_rounds += len(run.active)
        return self.verify_round(proposal, [a.length for a in run.active], slots, anchors, generator)

    def commit(self, run: RunState, step: Round) -> None:
        """Per request: record the round, emit accepted drafts + the next token, finish or keep the committed
        features for the drafter's next call."""
        still, features = [], step.features.split(step.block_lens)
        for r, (a, tokens, feats) in enumerate(zip(run.active, step.blocks.split(step.block_lens), features)):
            accepted, next_token = step.accepted[r], step.next_token[r]
            conf = step.confidences[r] if self.drafter.has_confidence else None
            a.length += accepted + 1
            a.anchor = next_token
            n_before = len(a.record.tokens)
            committed = [*step.drafts[r][:accepted], next_token]
            finished = a.emit(committed, [True] * accepted + [False], self.eos_id, run.now())
            a.record.rounds.append(RoundRecord(step.ells[r], accepted, len(a.record.tokens) - n_before, conf))
            if finished:
                self.finish(run, a)
            else:
                a.pending = (tokens[: accepted + 1], feats.take(accepted + 1))  # for the drafter's next call
                still.append(a)
        run.active = still

    def finish(self, run: RunState, a: ActiveRequest) -> None:
        """Free a finished request's slot in the target cache and the drafter."""
        self.cache.free(a.slot)
        self.drafter.release(a.slot)
        a.pending = None
        run.done()

    def decode_round(self, slots: torch.Tensor, anchors: torch.Tensor, generator: torch.Generator) -> Round:
        """A plain decode step for all (nobody drafts): the same draws, so tokens, as verifying zero drafts."""
        R = len(slots)
        res = self.target.forward_cached(anchors, slots, torch.ones_like(slots), self.cache, return_taps=True)
        next_token = self.target_tokens(res.logits, generator)  # (R,)
        nothing = torch.zeros(R, dtype=torch.long, device=slots.device)
        if self.scheduler is not None:
            self.scheduler.observe(nothing, nothing)
        outcome = read_outcome(nothing, next_token, nothing.new_zeros(R, 0), None)  # no drafts: (R, 0)
        features = TargetFeatures(res.taps, res.last_hidden)
        return Round([0] * R, [1] * R, anchors, features, *outcome)

    def verify_lengths(self, proposal: Proposal, lengths: list[int]) -> list[int]:
        """ℓ_r per request: the scheduler's (all g without one), capped by the context left after `lengths`."""
        R, g = proposal.tokens.shape
        wanted = [g] * R
        if self.scheduler is not None:  # host sync: the lengths decide the shape of the target pass
            wanted = to_host(self.scheduler(proposal).long(), "engine: verify lengths")
        if any(not 0 <= w <= g for w in wanted):
            raise ValueError(f"verify lengths must be in 0..{g}")
        return [min(w, self.target.config.max_seq_len - n - 1) for w, n in zip(wanted, lengths)]

    def verify_round(
        self,
        proposal: Proposal,
        lengths: list[int],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
    ) -> Round:
        """ONE ragged pass over anchor + ℓ_r drafts, `verify`, and the caches rolled back to anchor + accepted."""
        target, cache, device = self.target, self.cache, model_device(self.target)
        R, g = proposal.tokens.shape
        drafts = proposal.tokens  # (R, γ)
        ells = self.verify_lengths(proposal, lengths)
        verify_lens = upload(ells, device)  # (R,)
        block_lens = [ell + 1 for ell in ells]
        # (N,) where each verified token sits in the (R, γ+1) blocks: an index, not a mask (no sync)
        keep = upload([r * (g + 1) + k for r, n in enumerate(block_lens) for k in range(n)], device)
        blocks = torch.cat([anchors[:, None], drafts], dim=1).flatten()[keep]  # (N,) flat, request-major
        res = target.forward_cached(blocks, slots, upload(block_lens, device), cache, return_taps=True)
        # drawn at every temperature, so the generator advances alike
        uniforms = draw_uniforms(R, g, generator, device)
        if self.params.greedy:  # p and q one-hot: compare the drafts with the target's argmax (verify_greedy)
            top = torch.zeros(R, g + 1, dtype=torch.long, device=device)  # (R, γ+1)
            top.view(-1)[keep] = res.logits.float().argmax(-1)  # (argmax is slow on bf16 here)
            result = verify_greedy(drafts, top, verify_lens)
        else:
            V = target.config.vocab_size
            target_probs = torch.zeros(R, g + 1, V, device=device)  # (R, γ+1, V)
            target_probs.view(-1, V)[keep] = probabilities(res.logits, self.params)
            result = verify(drafts, proposal.probs, target_probs, verify_lens, *uniforms)
        if self.scheduler is not None:
            self.scheduler.observe(verify_lens, result.accepted)
        cache.lengths[slots] -= verify_lens - result.accepted  # roll back: anchor + accepted drafts stay
        outcome = read_outcome(result.accepted, result.next_token, drafts, proposal.confidence)
        return Round(ells, block_lens, blocks, TargetFeatures(res.taps, res.last_hidden), *outcome)

    def target_tokens(self, logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(S, V) logits -> (S,) tokens; at T = 0 the argmax (the draw from a one-hot, without building it)."""
        uniforms = generator_uniforms(tuple(logits.shape[:-1]), generator, logits.device)  # (S,)
        if self.params.greedy:
            return logits.float().argmax(-1)
        return sample_from_probs(probabilities(logits, self.params), uniforms)

    def draft(
        self,
        active: list[ActiveRequest],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
        gamma: int,
    ) -> Proposal:
        """The drafter's proposal after each anchor, fed what each request committed since its last call."""
        tokens = torch.cat([a.pending[0] for a in active])  # (n,) request-major
        taps = torch.cat([a.pending[1].taps for a in active])
        last_hidden = torch.cat([a.pending[1].last_hidden for a in active])
        lens = upload([len(a.pending[0]) for a in active], model_device(self.target))  # (R,)
        features = TargetFeatures(taps, last_hidden)
        return self.drafter.propose(slots, tokens, features, lens, anchors, gamma, self.params, generator)


# ---- a batch of prompts through the engine (every prompt admitted at once) ----
@dataclass
class SpeculativeResult(GenerationResult):
    from_draft: list[list[bool]] = field(default_factory=list)  # per emitted token: was it an accepted draft?
    stats: RoundStats = field(default_factory=RoundStats)  # per request, per round: ℓ_r, a_r, confidences


def speculative_generate(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    gamma: int,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    scheduler: Scheduler | None = None,
    engine_class: type[Engine] | None = None,
) -> SpeculativeResult:
    """Generate for every prompt, `drafter` proposing `gamma` tokens per round; `scheduler` (default: verify
    all γ) must depend only on the proposal and earlier rounds, or losslessness is lost. `engine_class`:
    `Engine`, or a subclass (the lab's cost-aware engine also decides who drafts)."""
    check_max_new_tokens(max_new_tokens)
    check_prompts(prompts, target.config.max_seq_len, target.config.vocab_size)
    engine = (engine_class or Engine)(target, drafter, params, gamma, len(prompts), eos_id, scheduler)
    run = engine.run([Request(p, max_new_tokens) for p in prompts], generator)
    tokens, reasons, drafted = map(list, zip(*[(r.tokens, r.stop_reason, r.from_draft) for r in run.records]))
    seconds = (run.prefill_seconds, run.seconds - run.prefill_seconds)  # prefill, decode
    return SpeculativeResult(tokens, reasons, *seconds, run.steps, drafted, run.stats)
