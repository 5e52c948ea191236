"""A continuous-batching speculative serving engine (walkthrough/DESIGN.md section 6, paper section 5).

Requests wait in a queue; at most `concurrency` are active, each in its own KV-cache slot. Every step:

  1. admit waiting requests while slots are free (closed loop, or once their arrival time has passed),
     rejecting bad ones (empty, too long, nothing to generate) one by one; prefill the admitted prompts in
     ONE ragged target pass whose last logits give each its first token;
  2. the drafter proposes γ tokens after every active request's anchor (or a narrower block, or none, for
     the requests the scheduler's speculate-or-not picks), first appending what was committed since its
     last call: one `Proposal` of tokens, their q and, with a trained head, confidences;
  3. the scheduler (dspark/scheduling/scheduler.py) gives ℓ_r per request, capped by the context left;
  4. ONE ragged target pass over every request's anchor + ℓ_r drafts (no padding), then `verify`;
  5. roll every cache back to anchor + accepted drafts, emit the accepted drafts + the correction/bonus
     token, stop at EOS, `max_new_tokens` or the context, free the slots.

`Engine.run` is these phases, one method each: `admit` + `prefill` (1), `plan` (who drafts, how wide),
`draft` (2), `verify_round` (3-4) or `decode_round` (nobody drafts), `commit` (5); one `ActiveRequest`
(requests.py) per active request. With a `NoDrafter` (γ = 0) it is plain continuous batching. The result
holds every request's record and the round statistics (`EngineResult.stats`).

Device: tensors live on the target's device; the bookkeeping (slots, anchors, lengths) stays on the host,
where it is decided, and is uploaded without waiting. Each step reads the device back at a few counted
points (`EngineResult.host_syncs`): the ragged index, the verify lengths, the policy's own Python walk, and
the round's outcome in one read.
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

from dspark.decoding import check_token_ids, is_integer
from dspark.device import generator_uniforms, host_syncs, model_device, to_host, upload
from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample_from_probs
from dspark.scheduling.scheduler import Scheduler
from dspark.serving.requests import RECENT_ROUNDS, ActiveRequest, EngineResult, Request, RequestRecord
from dspark.verify import draw_uniforms, verify, verify_greedy

__all__ = ["Engine", "EngineResult", "Request", "RequestRecord"]


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
        return EngineResult(self.records, self.now(), self.prefill_seconds, self.steps, self.step_syncs,
                            self.prefill_syncs, self.draft_seconds, self.drafted_rounds)  # fmt: skip


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
    drafting: list[bool]  # per request: did it draft this step


def read_outcome(
    accepted: torch.Tensor, next_token: torch.Tensor, drafts: torch.Tensor, confidence: torch.Tensor | None
) -> tuple[list[int], list[int], list[list[int]], list[list[float]]]:
    """The round's outcome on the host in ONE read: (R,) accepted counts and next tokens, (R, g) drafts and
    confidences (int64 values and fp32 confidences are exact in fp64) -- emitting and stopping are decided
    from these."""
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
        """`scheduler` (dspark/scheduling/scheduler.py; None: every request drafts and verifies all γ)
        decides each step, before drafting, who drafts and how wide a block (`speculate`: widths in 0..γ,
        the drafting requests draft the widest of them; the others take a plain decode step in the same
        target pass and their committed tokens wait for the drafter's next call), then ℓ_r from the
        proposal (`scheduler(proposal) -> (R,)`), and hears each step's outcome (`observe`). It must
        depend only on the proposal and earlier rounds, or losslessness is lost."""
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
        """Raise ValueError for a request no engine could serve as asked: token ids that are not integers in
        the vocabulary, a budget that is not an integer, an arrival time that is negative or not a finite
        number of seconds. Requests are numbered from 1; checked once per `run`, on the host lists. (An
        empty prompt, one too long for the context or a budget below 1 is rejected per request instead.)"""
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
                raise ValueError(f"request {i}: the arrival time must be a finite number of seconds >= 0, got "
                                 f"{arrival!r}")  # fmt: skip

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
            syncs_before, device = host_syncs(), model_device(self.target)
            widths = self.plan(run.active)
            slots = upload([a.slot for a in run.active], device)  # (R,)
            anchors = upload([a.anchor for a in run.active], device)  # (R,)
            if max(widths) == 0:  # no drafts to propose, schedule or verify: the step plain decoding takes
                step = self.decode_round(slots, anchors, generator)
            else:
                t_draft, drafting = time.perf_counter(), [w > 0 for w in widths]
                rows = [r for r, d in enumerate(drafting) if d]
                proposal = self.draft(rows, run.active, slots, anchors, generator, max(widths))
                run.draft_seconds += time.perf_counter() - t_draft
                run.drafted_rounds += len(rows)
                lengths = [a.length for a in run.active]
                step = self.verify_round(proposal, lengths, drafting, slots, anchors, generator)
            run.steps += 1
            self.commit(run, step)
            run.step_syncs.append(host_syncs() - syncs_before)
        return run.result()

    def admit(self, run: RunState) -> list[ActiveRequest]:
        """Step 1a: take waiting requests (arrived ones, in arrival order) while slots are free; a request
        no engine could serve as asked (empty, too long, nothing to generate) is rejected on its own."""
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
        """Step 1b: ONE ragged target pass over the newcomers' prompts; the last logits give each its first
        token (its anchor), every position's taps and hidden states wait for the drafter's first call."""
        t0, syncs_before, device = time.perf_counter(), host_syncs(), model_device(self.target)
        lens = [len(a.request.prompt) for a in newcomers]
        flat = upload([t for a in newcomers for t in a.request.prompt], device)  # (S·T,)
        slots = upload([a.slot for a in newcomers], device)
        last = upload(list(accumulate(lens)), device) - 1  # (S,) each prompt's last position
        res = self.target.forward_cached(flat, slots, upload(lens, device), self.cache, return_taps=True,
                                         logits_at=last)  # fmt: skip
        # host sync: the first tokens (emitted, checked for EOS)
        first = to_host(self.target_tokens(res.logits, generator), "engine: first tokens")
        features = TargetFeatures(res.taps, res.last_hidden).split(lens)
        for a, tokens, feats, token, n in zip(newcomers, flat.split(lens), features, first, lens):
            a.record.first_token = run.now()
            a.anchor, a.length = token, n
            if a.emit([token], [False], self.eos_id, run.now()):
                self.finish(run, a)
            else:
                a.pending = [(tokens, feats)]
                run.active.append(a)
        run.prefill_seconds += time.perf_counter() - t0
        run.prefill_syncs += host_syncs() - syncs_before

    def plan(self, active: list[ActiveRequest]) -> list[int]:
        """Step 2a, who drafts, decided from earlier rounds only: per request a block width in 0..γ
        (default: all γ; the scheduler may narrow it or say 0, a plain decode step for that request)."""
        gamma = self.gamma
        if self.scheduler is None or gamma == 0:
            return [gamma] * len(active)
        widths = self.scheduler.speculate([a.recent for a in active], [a.idle for a in active], gamma)
        if any(not 0 <= w <= gamma for w in widths):
            raise ValueError(f"draft widths must be in 0..{gamma}, got {widths}")
        return widths

    def commit(self, run: RunState, step: Round) -> None:
        """Step 5: per request, record the round, emit the accepted drafts + the next token, stop at EOS or
        a limit (freeing the slot), and keep the committed tokens' features for the drafter's next call
        (the caches were already rolled back to anchor + accepted drafts)."""
        still, features = [], step.features.split(step.block_lens)
        for r, (a, tokens, feats) in enumerate(zip(run.active, step.blocks.split(step.block_lens), features)):
            accepted, next_token, drafting, rec = (
                step.accepted[r],
                step.next_token[r],
                step.drafting[r],
                a.record,
            )
            rec.verify_lens.append(step.ells[r])
            rec.accepted.append(accepted)
            if self.drafter.has_confidence:
                conf = step.confidences[r] if drafting else []  # [] for a round without drafts
                rec.confidences.append(conf)
                if drafting:
                    a.recent = [*a.recent, conf][-RECENT_ROUNDS:]
            a.idle = 0 if drafting else a.idle + 1
            a.length += accepted + 1
            a.anchor = next_token
            n_before = len(rec.tokens)
            committed = [*step.drafts[r][:accepted], next_token]
            finished = a.emit(committed, [True] * accepted + [False], self.eos_id, run.now())
            rec.emitted.append(len(rec.tokens) - n_before)  # a + 1, fewer if EOS/the limit cut it
            if finished:
                self.finish(run, a)
            else:
                new = (tokens[: accepted + 1], feats.take(accepted + 1))
                a.pending = [new] if drafting else [*a.pending, new]  # waits for its next draft
                still.append(a)
        run.active = still

    def finish(self, run: RunState, a: ActiveRequest) -> None:
        """Free a finished request's slot in the target cache and the drafter."""
        self.cache.free(a.slot)
        self.drafter.release(a.slot)
        a.pending = []
        run.done()

    def decode_round(self, slots: torch.Tensor, anchors: torch.Tensor, generator: torch.Generator) -> Round:
        """Steps 3-4 when nobody drafts: one plain decode step for every request (slots, anchors: (R,)), with
        the same draws as verifying zero drafts (sampled from p_0), so the same tokens."""
        R = len(slots)
        res = self.target.forward_cached(anchors, slots, torch.ones_like(slots), self.cache, return_taps=True)
        next_token = self.target_tokens(res.logits, generator)  # (R,)
        nothing = torch.zeros(R, dtype=torch.long, device=slots.device)
        if self.scheduler is not None:
            self.scheduler.observe(nothing, nothing)
        outcome = read_outcome(nothing, next_token, nothing[:, None][:, :0], None)  # no drafts: (R, 0)
        features = TargetFeatures(res.taps, res.last_hidden)
        return Round([0] * R, [1] * R, anchors, features, *outcome, [False] * R)

    def verify_round(
        self,
        proposal: Proposal,
        lengths: list[int],
        drafting: list[bool],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
    ) -> Round:
        """Steps 3-4 of a step in which some request drafted: verify lengths (capped by the context left
        after each anchor; `lengths` the requests' cache lengths, on the host), ONE ragged target pass over
        anchor + ℓ_r drafts of every request, `verify`, and the caches rolled back to anchor + accepted."""
        target, cache, device = self.target, self.cache, model_device(self.target)
        context, (R, g) = target.config.max_seq_len, proposal.tokens.shape
        drafts = proposal.tokens  # (R, γ)
        wanted = [g] * R
        if self.scheduler is not None:  # host sync: the lengths decide the shape of the target pass
            wanted = to_host(self.scheduler(proposal).long(), "engine: verify lengths")
        if any(not 0 <= w <= g for w in wanted):
            raise ValueError(f"verify lengths must be in 0..{g}")
        ells = [min(w, context - n - 1) if d else 0 for w, n, d in zip(wanted, lengths, drafting)]
        verify_lens = upload(ells, device)  # (R,)
        block_lens = [ell + 1 for ell in ells]
        # (N,) where each verified token sits in the (R, γ+1) blocks: an index, not a mask (no sync)
        keep = upload([r * (g + 1) + k for r, n in enumerate(block_lens) for k in range(n)], device)
        blocks = torch.cat([anchors[:, None], drafts], dim=1).flatten()[keep]  # (N,) flat, request-major
        res = target.forward_cached(blocks, slots, upload(block_lens, device), cache, return_taps=True)
        # drawn at every temperature (the greedy path does not read them): the generator advances alike
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
        return Round(ells, block_lens, blocks, TargetFeatures(res.taps, res.last_hidden), *outcome, drafting)

    def target_tokens(self, logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(S, V) target logits -> (S,) tokens drawn from the target's distribution. At T = 0 the argmax:
        what the inverse-CDF draw from its one-hot returns, without building it. The uniforms are drawn at
        every temperature, so the generator advances alike."""
        uniforms = generator_uniforms(tuple(logits.shape[:-1]), generator, logits.device)  # (S,)
        if self.params.greedy:
            return logits.float().argmax(-1)
        return sample_from_probs(probabilities(logits, self.params), uniforms)

    def draft(
        self,
        rows: list[int],
        active: list[ActiveRequest],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
        gamma: int,
    ) -> Proposal:
        """The drafter's proposal for the requests at `rows` of `active` (slots and anchors: (R,), every
        active request's), with their committed tokens and features since its last call. All rows: the
        drafter's own proposal; otherwise the rows that do not draft are zeros and `drafted` marks them.
        `gamma` 0: nobody drafts, an empty (R, 0) proposal."""
        device, V, R = model_device(self.target), self.target.config.vocab_size, len(active)
        everyone = len(rows) == R
        index = None if everyone else upload(rows, device)  # (D,) the drafting rows
        who = [active[r] for r in rows]
        proposal = self.drafter.propose(
            slots if everyone else slots[index],
            torch.cat([t for a in who for t, _ in a.pending]),
            TargetFeatures(torch.cat([f.taps for a in who for _, f in a.pending]),
                           torch.cat([f.last_hidden for a in who for _, f in a.pending])),  # fmt: skip
            upload([sum(len(t) for t, _ in a.pending) for a in who], device),
            anchors if everyone else anchors[index],
            gamma, self.params, generator,
        ) if who else None  # fmt: skip
        if everyone:
            return proposal
        tokens = torch.zeros(R, gamma, dtype=torch.long, device=device)  # (R, γ)
        conf = torch.zeros(R, gamma, device=device) if self.drafter.has_confidence else None  # (R, γ)
        drafted = torch.zeros(R, dtype=torch.bool, device=device)
        if proposal is not None:
            tokens[index], drafted[index] = proposal.tokens, True
            if conf is not None:
                conf[index] = proposal.confidence.to(conf.dtype)

        def probs() -> torch.Tensor:  # (R, γ, V), built only if read (greedy verification does not)
            full = torch.zeros(R, gamma, V, device=device)
            if proposal is not None:
                full[index] = proposal.probs
            return full

        return Proposal(tokens, probs, conf, drafted)
