"""A continuous-batching speculative serving engine (walkthrough/DESIGN.md section 6, paper section 5).

Requests wait in a queue. The engine keeps at most `concurrency` of them
active, each in its own KV-cache slot; every step it

  1. admits waiting requests while slots are free (closed loop: as soon as
     one finishes; Poisson mode: once their arrival time has passed),
     rejecting bad ones (empty, too long for the context, nothing to
     generate) individually, and prefills the admitted prompts in ONE ragged
     target pass whose last logits give each request its first token;
  2. lets the drafter propose γ tokens after every active request's anchor
     (or a narrower block, or none, for the requests the speculate-or-not
     decision picks; it first appends the context committed since its last call):
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

Device: every tensor lives on the target's device (`model_device(target)`); the
bookkeeping (slots, anchors, cache lengths, verify lengths) stays on the host,
where it is decided, and is uploaded without waiting for the device
(dspark/device.py). Each step reads the device back at a few counted points
(`EngineResult.host_syncs`, README "On a GPU"): the ragged index of each pass
(its shapes), the verify lengths (they shape the target pass), the policy's
own decisions where it walks in Python, and the round's outcome (tokens to
emit, stops to check) in one read.

What this file does not do: choose verify lengths (policies) or simulate a GPU
(the trace-driven simulator).
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
from dspark.model import ModelOutput, Transformer
from dspark.sampling import SamplingParams, probabilities, sample_from_probs
from dspark.scheduling.step import RECENT_ROUNDS
from dspark.serving.rounds import RoundStats
from dspark.verify import draw_uniforms, verify, verify_greedy


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
    host_syncs: list[int] = field(default_factory=list)  # per step: device-to-host reads (dspark/device.py)
    prefill_host_syncs: int = 0  # the same, in all prefill passes together
    draft_seconds: float = 0.0  # wall time spent in the drafter's propose calls (all steps)
    drafted_rounds: int = 0  # request-rounds in which the request drafted (speculate_fn said yes)

    @property
    def host_syncs_per_step(self) -> float:
        """Mean device-to-host reads per step (each waits for the device; README, "On a GPU")."""
        return sum(self.host_syncs) / len(self.host_syncs) if self.host_syncs else 0.0

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
        speculate_fn: Callable[[list[list[list[float]]], list[int], int], torch.Tensor] | None = None,
    ) -> None:
        """`verify_len_fn(proposal) -> (R,)` picks ℓ_r (default: all γ), e.g. a
        `VerifyScheduler`; it must depend only on the proposal and earlier rounds, or
        losslessness is lost. `observe_fn(verify_lens, accepted)` hears each step's
        outcome (a VerifyScheduler's `observe`). `speculate_fn(history, idle_steps, γ) -> (R,)`
        decides before drafting which requests draft this step (default: all) and how wide a
        block: int64 widths in 0..γ (the drafting requests draft the widest of them), or bool
        (True: γ), from each one's recent drafted rounds' confidences and its steps since it
        last drafted (a VerifyScheduler's `speculate`); the others take a plain decode step in
        the same target pass and their committed tokens wait for the drafter's next call."""
        if not 0 <= gamma <= drafter.max_gamma:
            raise ValueError(f"gamma must be in 0..{drafter.max_gamma} for drafter {drafter.name!r}")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.target, self.drafter, self.params, self.gamma = target, drafter, params, gamma
        self.concurrency, self.eos_id = concurrency, eos_id
        self.verify_len_fn, self.observe_fn, self.speculate_fn = verify_len_fn, observe_fn, speculate_fn
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
        target, drafter, cache, gamma = self.target, self.drafter, self.cache, self.gamma
        context = target.config.max_seq_len
        records = [RequestRecord() for _ in requests]
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        queue = deque(order)
        # per active request: slot, anchor, and the tokens/features committed since the drafter's last call
        active: list[int] = []
        slot_of, anchor_of, limit_of = {}, {}, {}
        length_of: dict[int, int] = {}  # the request's target-cache length, kept on the host (no reads)
        recent_of: dict[int, list[list[float]]] = {}  # confidences of its last drafted rounds (speculate_fn)
        idle_of: dict[int, int] = {}  # steps since it last drafted
        # per request: (tokens, features) chunks committed since the drafter's last call (one per step)
        pending: dict[int, list[tuple[torch.Tensor, TargetFeatures]]] = {}
        start, prefill_seconds, steps, draft_seconds, drafted_rounds = time.perf_counter(), 0.0, 0, 0.0, 0
        step_syncs, prefill_syncs = [], 0
        device = model_device(target)

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
                t0, syncs_before = time.perf_counter(), host_syncs()
                lens = [len(requests[i].prompt) for i in admitted]
                flat = upload([t for i in admitted for t in requests[i].prompt], device)
                slots = upload([slot_of[i] for i in admitted], device)
                last = upload(list(accumulate(lens)), device) - 1  # (S,) each prompt's last position
                # taps and hidden states of every prompt position (the drafter's context), logits of the last
                res = target.forward_cached(flat, slots, upload(lens, device), cache, return_taps=True,
                                            logits_at=last)  # fmt: skip
                first = self.target_tokens(res.logits, generator)  # (S,)
                first = to_host(first, "engine: first tokens")  # host sync: emit them, check EOS
                feats = TargetFeatures(res.taps, res.last_hidden).split(lens)
                for row, (i, toks) in enumerate(zip(admitted, flat.split(lens))):
                    records[i].first_token = now()
                    anchor_of[i], length_of[i], recent_of[i], idle_of[i] = first[row], lens[row], [], 0
                    if emit(i, [anchor_of[i]], [False]):
                        finish(i)
                    else:
                        pending[i] = [(toks, feats[row])]
                        active.append(i)
                prefill_seconds += time.perf_counter() - t0
                prefill_syncs += host_syncs() - syncs_before
            if not active:
                if queue:  # Poisson mode: idle until the next arrival
                    time.sleep(max(0.0, requests[queue[0]].arrival - now()))
                continue

            # 2. who drafts (decided from earlier rounds only), then draft
            R, syncs_before = len(active), host_syncs()
            widths = [gamma] * R
            if self.speculate_fn is not None and gamma > 0:
                plan = self.speculate_fn([recent_of[i] for i in active], [idle_of[i] for i in active], gamma)
                widths = (plan.long() * gamma if plan.dtype == torch.bool else plan).tolist()  # host-side
                if any(not 0 <= w <= gamma for w in widths):
                    raise ValueError(f"draft widths must be in 0..{gamma}, got {widths}")
            drafting = [w > 0 for w in widths]
            slots = upload([slot_of[i] for i in active], device)
            anchors = upload([anchor_of[i] for i in active], device)
            g = max(widths)  # the block the drafting requests draft; 0: nobody drafts, a plain decode step
            if g == 0:  # no drafts to propose, schedule or verify: the step plain decoding takes
                ells, block_lens, blocks = [0] * R, [1] * R, anchors
                res = target.forward_cached(blocks, slots, torch.ones_like(slots), cache, return_taps=True)
                steps += 1
                # the same draws as verifying zero drafts (sample from p_0), so the same tokens
                next_token = self.target_tokens(res.logits, generator)  # (R,)
                if self.observe_fn is not None:
                    nothing = torch.zeros(R, dtype=torch.long, device=device)
                    self.observe_fn(nothing, nothing)
                # host sync: the round's next tokens (emitting and stopping are decided here)
                outcome = to_host(torch.stack([torch.zeros_like(next_token), next_token], 1).double(),
                                  "engine: the round's outcome")  # fmt: skip
            else:
                t_draft = time.perf_counter()
                proposal = self.draft(
                    [r for r in range(R) if drafting[r]], active, slots, anchors, pending, generator, g
                )
                draft_seconds += time.perf_counter() - t_draft
                drafted_rounds += sum(drafting)
                ells, block_lens, blocks, res, outcome = self.verify_round(
                    proposal, [length_of[i] for i in active], drafting, slots, anchors, generator
                )
                steps += 1
            # 5. emit, commit, finish (the caches were rolled back to anchor + accepted drafts)
            feats = TargetFeatures(res.taps, res.last_hidden).split(block_lens)
            still = []
            for r, (i, toks) in enumerate(zip(active, blocks.split(block_lens))):
                a, next_token = int(outcome[r][0]), int(outcome[r][1])
                rec = records[i]
                rec.verify_lens.append(ells[r])
                rec.accepted.append(a)
                if self.drafter.has_confidence:
                    conf = outcome[r][2 + g :] if drafting[r] else []  # [] for a round without drafts
                    rec.confidences.append(conf)
                    if drafting[r]:
                        recent_of[i] = [*recent_of[i], conf][-RECENT_ROUNDS:]
                idle_of[i] = 0 if drafting[r] else idle_of[i] + 1
                length_of[i] += a + 1
                anchor_of[i] = next_token
                n_before = len(rec.tokens)
                finished = emit(i, [*map(int, outcome[r][2 : 2 + a]), next_token], [True] * a + [False])
                rec.emitted.append(len(rec.tokens) - n_before)  # a + 1, fewer if EOS/the limit cut it
                if finished:
                    finish(i)
                else:
                    new = (toks[: a + 1], feats[r].take(a + 1))
                    pending[i] = [new] if drafting[r] else [*pending[i], new]  # waits for its next draft
                    still.append(i)
            active = still
            step_syncs.append(host_syncs() - syncs_before)
        return EngineResult(records, now(), prefill_seconds, steps, step_syncs, prefill_syncs, draft_seconds,
                            drafted_rounds)  # fmt: skip

    def verify_round(
        self,
        proposal: Proposal,
        lengths: list[int],
        drafting: list[bool],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[list[int], list[int], torch.Tensor, ModelOutput, torch.Tensor]:
        """Steps 3-4 of a step in which some request drafted: verify lengths (capped by the context left
        after each anchor; `lengths` the requests' cache lengths, on the host), ONE ragged target pass over
        anchor + ℓ_r drafts of every request, `verify`, and the caches rolled back to anchor + accepted.
        Returns (ℓ per request, block lengths, the flat verified tokens, the target pass, the round's
        outcome on the host: per request [accepted, next token, drafts..., confidences...])."""
        target, cache, device = self.target, self.cache, model_device(self.target)
        context, (R, g) = target.config.max_seq_len, proposal.tokens.shape
        drafts = proposal.tokens  # (R, γ)
        wanted = [g] * R
        if self.verify_len_fn:  # host sync: the lengths decide the shape of the target pass
            wanted = to_host(self.verify_len_fn(proposal).long(), "engine: verify lengths")
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
        if self.observe_fn is not None:
            self.observe_fn(verify_lens, result.accepted)
        cache.lengths[slots] -= verify_lens - result.accepted  # roll back: anchor + accepted drafts stay
        outcome = [result.accepted[:, None], result.next_token[:, None], drafts]
        if proposal.confidence is not None:
            outcome.append(proposal.confidence)
        # host sync: the round's outcome (accepted count, next token, drafts, confidences; int64 values
        # and fp32 confidences are exact in fp64) -- emitting tokens and stopping are decided here
        outcome = to_host(torch.cat([t.double() for t in outcome], dim=1), "engine: the round's outcome")
        return ells, block_lens, blocks, res, outcome

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
        active: list[int],
        slots: torch.Tensor,
        anchors: torch.Tensor,
        pending: dict[int, list[tuple[torch.Tensor, TargetFeatures]]],
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
            torch.cat([t for i in who for t, _ in pending[i]]),
            TargetFeatures(torch.cat([f.taps for i in who for _, f in pending[i]]),
                           torch.cat([f.last_hidden for i in who for _, f in pending[i]])),  # fmt: skip
            upload([sum(len(t) for t, _ in pending[i]) for i in who], device),
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
