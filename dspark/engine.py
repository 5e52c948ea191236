"""A continuous-batching speculative serving engine (DESIGN.md section 6). Each step of `Engine.run`:

    admit + prefill    free slots take arrived requests; ONE ragged pass over their prompts
    draft              the drafter's `Proposal` of γ tokens after every anchor
    verify_round       ℓ_r from the scheduler; ONE ragged pass over anchor + ℓ_r drafts; `verify`; roll back
    commit             emit accepted drafts + the next token; stop at EOS or a limit, free the slot

Tensors live on the target's device; the bookkeeping (slots, anchors, lengths) stays on the host, one
`RequestRecord` per request, and is uploaded without waiting; each step reads the device at a few points
(`# host sync`). `speculative_generate` (at the end) runs a batch of prompts through it: at T = 0
token-identical to plain decoding (`decoding.generate`: this engine without a drafter) for every drafter and
policy, at T > 0 exactly the target's distribution.
"""

from __future__ import annotations

import numbers
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from dspark.device import generator_uniforms, model_device, upload
from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.model import ModelConfig, Transformer
from dspark.requests import Request, RequestRecord, RoundRecord, RoundStats
from dspark.sampling import SamplingParams, probabilities, sample_from_probs
from dspark.scheduler import Scheduler
from dspark.verify import draw_uniforms, verify, verify_greedy


@dataclass
class Run:
    """One `Engine.run`: while it runs, the queue and the requests holding slots; after, every request's
    record and where the time went."""

    records: list[RequestRecord]  # one per request, in submission order
    queue: deque[int] = field(default_factory=deque)  # waiting: indices into `records`, by arrival
    active: list[RequestRecord] = field(default_factory=list)  # holding a slot
    progress: Callable[[int], None] | None = None  # called with 1 as each request finishes
    start: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0  # wall time of the whole run
    prefill_seconds: float = 0.0  # spent in prefill passes
    steps: int = 0  # target passes after prefill (one per step)
    draft_seconds: float = 0.0  # spent in the drafter's propose calls
    drafted_rounds: int = 0  # request-rounds in which the request drafted

    def now(self) -> float:
        return time.perf_counter() - self.start

    def request_ended(self) -> None:
        """One request is done (served, or rejected): tell `progress`."""
        if self.progress:
            self.progress(1)

    @property
    def tokens(self) -> list[list[int]]:
        return [r.tokens for r in self.records]

    @property
    def stop_reasons(self) -> list[str]:
        return [r.stop_reason for r in self.records]

    @property
    def from_draft(self) -> list[list[bool]]:
        return [r.from_draft for r in self.records]

    @property
    def stats(self) -> RoundStats:
        """Every request's rounds (ℓ, accepted, confidences), in submission order."""
        return RoundStats([r.rounds for r in self.records])

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.prefill_seconds

    @property
    def new_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.records)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second over all requests."""
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Round:
    """One step's target pass as the commit phase reads it (R active requests, N verified tokens)."""

    ells: list[int]  # per request: ℓ, the drafts it verified (0 in a plain decode step)
    block_lens: list[int]  # per request: ℓ + 1, its anchor and the verified drafts
    blocks: torch.Tensor  # (N,) the verified tokens, request-major
    features: TargetFeatures | None  # of the N positions (None where nobody ever drafts)
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
    rows = torch.cat([t.double() for t in parts], dim=1).tolist()  # host sync: the round's outcome
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
        context: int | None = None,
    ) -> None:
        """`scheduler` (None: verify all γ) decides each round's ℓ_r; it must depend only on the proposal and
        earlier rounds, or losslessness is lost. Every active request drafts γ (0: plain decode steps).
        `context`: tokens per request in the KV cache (default the model's context; less saves memory)."""
        if not 0 <= gamma <= drafter.max_gamma:
            raise ValueError(f"gamma must be in 0..{drafter.max_gamma} for drafter {drafter.name!r}")
        self.target, self.drafter, self.params, self.gamma = target, drafter, params, gamma
        self.concurrency, self.eos_id = concurrency, eos_id
        self.scheduler = scheduler
        self.cache = target.new_cache(concurrency, max_seq_len=context)
        self.context = self.cache.max_seq_len
        self.drafter.reset(self.cache.n_slots)

    def rejection(self, request: Request) -> str:
        context = self.context
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
    ) -> Run:
        """Serve `requests` to completion; `progress(n)` is called as n more requests finish."""
        generator = generator or torch.Generator().manual_seed(0)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        run = Run([RequestRecord(r) for r in requests], deque(order), progress=progress)
        while run.queue or run.active:
            newcomers = self.admit(run)
            if newcomers:
                self.prefill(run, newcomers, generator)
            if not run.active:
                if run.queue:  # Poisson mode: idle until the next arrival
                    time.sleep(max(0.0, requests[run.queue[0]].arrival - run.now()))
                continue
            self.commit(run, self.step(run, generator))
            run.steps += 1
        run.seconds = run.now()
        return run

    def admit(self, run: Run) -> list[RequestRecord]:
        """Arrived requests, in order, while slots are free; a bad one is rejected on its own."""
        newcomers: list[RequestRecord] = []
        context = self.context
        while run.queue and len(run.active) + len(newcomers) < self.concurrency:
            a = run.records[run.queue[0]]
            if a.request.arrival > run.now():
                break
            run.queue.popleft()
            a.submitted = a.request.arrival if a.request.arrival else run.now()
            a.error = self.rejection(a.request)
            if a.error:
                a.stop_reason = "rejected"
                run.request_ended()
                continue
            a.slot = self.cache.allocate()
            a.limit = min(a.request.max_new_tokens, context - len(a.request.prompt) + 1)
            newcomers.append(a)
        return newcomers

    def prefill(self, run: Run, newcomers: list[RequestRecord], generator: torch.Generator) -> None:
        """ONE ragged pass over the newcomers' prompts: the last logits give each its anchor; the features
        wait for the drafter's first call (none are taken where nobody ever drafts, γ = 0)."""
        t0, device = time.perf_counter(), model_device(self.target)
        lens = [len(a.request.prompt) for a in newcomers]
        flat = upload([t for a in newcomers for t in a.request.prompt], device)  # (S·T,)
        slots = upload([a.slot for a in newcomers], device)
        last = upload(list(accumulate(lens)), device) - 1  # (S,) each prompt's last position
        taps = self.gamma > 0
        res = self.target.forward_cached(
            flat, slots, upload(lens, device), self.cache, return_taps=taps, logits_at=last
        )
        first = self.target_tokens(res.logits, generator).tolist()  # host sync: emitted, checked for EOS
        features = TargetFeatures(res.taps, res.last_hidden).split(lens) if taps else [None] * len(lens)
        for a, tokens, feats, token, n in zip(newcomers, flat.split(lens), features, first, lens):
            a.first_token = run.now()
            a.anchor, a.length = token, n
            if a.emit([token], [False], self.eos_id, run.now()):
                self.finish(run, a)
            else:
                a.unseen_tokens, a.unseen_features = tokens, feats
                run.active.append(a)
        run.prefill_seconds += time.perf_counter() - t0

    def step(self, run: Run, generator: torch.Generator) -> Round:
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

    def commit(self, run: Run, outcome: Round) -> None:
        """Per request: record the round, emit accepted drafts + the next token, finish or keep the committed
        tokens and features for the drafter's next call."""
        still = []
        features = (
            outcome.features.split(outcome.block_lens) if outcome.features else [None] * len(run.active)
        )
        for r, (a, tokens, feats) in enumerate(
            zip(run.active, outcome.blocks.split(outcome.block_lens), features)
        ):
            accepted, next_token = outcome.accepted[r], outcome.next_token[r]
            conf = outcome.confidences[r] if self.drafter.has_confidence else None
            a.length += accepted + 1
            a.anchor = next_token
            n_before = len(a.tokens)
            committed = [*outcome.drafts[r][:accepted], next_token]
            finished = a.emit(committed, [True] * accepted + [False], self.eos_id, run.now())
            a.rounds.append(RoundRecord(outcome.ells[r], accepted, len(a.tokens) - n_before, conf))
            if finished:
                self.finish(run, a)
            else:  # for the drafter's next call
                a.unseen_tokens = tokens[: accepted + 1]
                a.unseen_features = feats.take(accepted + 1) if feats else None
                still.append(a)
        run.active = still

    def finish(self, run: Run, a: RequestRecord) -> None:
        """Free a finished request's slot in the target cache and the drafter."""
        self.cache.free(a.slot)
        self.drafter.release(a.slot)
        a.unseen_tokens = a.unseen_features = None
        run.request_ended()

    def decode_round(self, slots: torch.Tensor, anchors: torch.Tensor, generator: torch.Generator) -> Round:
        """A plain decode step for all (nobody drafts): the same draws, so tokens, as verifying zero drafts."""
        R, taps = len(slots), self.gamma > 0
        res = self.target.forward_cached(anchors, slots, torch.ones_like(slots), self.cache, return_taps=taps)
        next_token = self.target_tokens(res.logits, generator)  # (R,)
        nothing = torch.zeros(R, dtype=torch.long, device=slots.device)
        if self.scheduler is not None:
            self.scheduler.observe(nothing, nothing)
        outcome = read_outcome(nothing, next_token, nothing.new_zeros(R, 0), None)  # no drafts: (R, 0)
        features = TargetFeatures(res.taps, res.last_hidden) if taps else None
        return Round([0] * R, [1] * R, anchors, features, *outcome)

    def verify_lengths(self, proposal: Proposal, lengths: list[int]) -> list[int]:
        """ℓ_r per request: the scheduler's (all g without one), capped by the context left after `lengths`."""
        R, g = proposal.tokens.shape
        wanted = [g] * R
        if self.scheduler is not None:  # host sync: the lengths decide the shape of the target pass
            wanted = self.scheduler(proposal).long().tolist()
        assert all(0 <= w <= g for w in wanted), f"verify lengths must be in 0..{g}"
        return [min(w, self.context - n - 1) for w, n in zip(wanted, lengths)]

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
        active: list[RequestRecord],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
        gamma: int,
    ) -> Proposal:
        """The drafter's proposal after each anchor, fed what each request committed since its last call."""
        tokens = torch.cat([a.unseen_tokens for a in active])  # (n,) request-major
        taps = torch.cat([a.unseen_features.taps for a in active])
        last_hidden = torch.cat([a.unseen_features.last_hidden for a in active])
        lens = upload([len(a.unseen_tokens) for a in active], model_device(self.target))  # (R,)
        features = TargetFeatures(taps, last_hidden)
        return self.drafter.propose(slots, tokens, features, lens, anchors, gamma, self.params, generator)


# ---- a batch of prompts through the engine (every prompt admitted at once) ----
def is_integer(value: object) -> bool:
    """A Python or NumPy integer, not a bool (True is an int to Python, never a token id or a count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_inputs(prompts: list[list[int]], max_new_tokens: int, config: ModelConfig) -> None:
    """The batch entry points' one check: ValueError unless there are prompts, the budget is an integer >= 1
    and every prompt a non-empty list of token ids in the vocabulary, shorter than the context (torch would
    truncate a float id, or fail with a bare IndexError)."""
    if not is_integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not prompts:
        raise ValueError("no prompts given")
    V, context = config.vocab_size, config.max_seq_len
    for i, p in enumerate(prompts, start=1):
        if not (isinstance(p, (list, tuple)) and 0 < len(p) < context and all(is_integer(t) for t in p)):
            raise ValueError(
                f"prompt {i} must be a non-empty list of token ids, shorter than the {context}-token context"
            )
        if not 0 <= min(p) <= max(p) < V:
            raise ValueError(f"prompt {i}: a token id is outside the vocabulary 0..{V - 1}")


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
    context: int | None = None,
) -> Run:
    """Generate for every prompt, `drafter` proposing `gamma` tokens per round; `scheduler` (default: verify
    all γ) must depend only on the proposal and earlier rounds, or losslessness is lost. `engine_class`:
    `Engine`, or a subclass (the lab's cost-aware engine also decides who drafts); `context`: see `Engine`."""
    check_inputs(prompts, max_new_tokens, target.config)
    engine_class = engine_class or Engine
    engine = engine_class(target, drafter, params, gamma, len(prompts), eos_id, scheduler, context)
    return engine.run([Request(p, max_new_tokens) for p in prompts], generator)
