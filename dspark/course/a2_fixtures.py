"""Test doubles for assignment 2's checks: a tiny target, a drafter that knows the answer and
audits its calls, and a recorder of the target's cached passes.

* `tiny_target()`: a random 3-layer target (vocabulary 97, context 128) whose greedy output
  varies, fast on a CPU.
* `TruthDrafter`: proposes the true greedy continuation (computed in advance with plain
  `dspark.decoding.generate`), each draft corrupted with probability `noise` by its own
  generator; with noise 0 every draft is accepted, so EOS and max-new-tokens fall inside
  blocks. It also checks what the loop hands it: on its first call for a slot the whole
  prompt, then exactly the tokens committed since (anchor + accepted drafts), the anchor
  that follows them, and the target's own features at those positions.
* `record_passes(target)`: replaces `target.forward_cached` (an instance attribute) by a
  `PassRecorder` that logs every pass: slots, block lengths, cache lengths before, tokens.

Both are probes (dspark/course/framework.py): they run with the student's code in the check's
process and record only; their records come back as plain data and are judged here, in the
grader -- the drafter's audit is replayed on the grader's own copy.

What this file does not do: grade (dspark/course/a2_round.py does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dspark.course.framework import Probe
from dspark.decoding import generate
from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.model import ModelConfig, Transformer
from dspark.sampling import SamplingParams

TINY = ModelConfig(
    vocab_size=97,
    dim=48,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    ffn_hidden=80,
    max_seq_len=128,
    tap_layers=(0, 1),
)
GREEDY = SamplingParams(temperature=0.0)


def tiny_target() -> Transformer:
    """Weights of std 0.2 (not the usual 0.02, under which a random model just repeats its
    last token): greedy outputs vary from token to token and depend on the whole context,
    so a cache that lost or kept a wrong position changes them. A new model every time (the
    same weights): a check may record its passes, and the next check must not see that."""
    torch.manual_seed(0)
    target = Transformer(TINY).eval()
    with torch.no_grad():
        for weight in target.parameters():
            if weight.dim() == 2:
                weight.normal_(0.0, 0.2)
    return target


def ragged_prompts(lengths: list[int], seed: int = 0, vocab: int = TINY.vocab_size) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(6, vocab, (n,), generator=g).tolist() for n in lengths]


def truths(target: Transformer, prompts: list[list[int]], max_new: int, eos_id: int | None = None):
    """(plain greedy outputs, {prompt: prompt + output}) -- what every speculative loop must reproduce."""
    outputs = generate(target, prompts, max_new, GREEDY, eos_id=eos_id).tokens
    return outputs, {tuple(p): p + out for p, out in zip(prompts, outputs)}


class TruthDrafter(Drafter, Probe):
    name = "truth"

    def __init__(
        self,
        target: Transformer,
        truth: dict[tuple, list[int]],
        noise: float = 0.0,
        seed: int = 0,
        check_features: bool = False,
    ) -> None:
        super().__init__()
        self.max_gamma, self.truth, self.noise = 16, truth, noise
        self.vocab = target.config.vocab_size
        self._target = (target,)  # not a submodule
        self.rng = torch.Generator().manual_seed(seed)
        self.check_features = check_features
        self.problems: list[str] = []
        self.calls = 0
        self.events: list[tuple] = []  # every reset / release / propose, with its arguments

    def reset(self, n_slots: int) -> None:
        self.events.append(("reset", int(n_slots)))
        self._reset(int(n_slots))

    def release(self, slot: int) -> None:
        self.events.append(("release", int(slot)))
        self._release(int(slot))

    def _reset(self, n_slots: int) -> None:
        self.history: dict[int, list[int]] = {s: [] for s in range(n_slots)}
        self.sequence: dict[int, list[int]] = {}

    def _release(self, slot: int) -> None:
        self.history[slot] = []

    def grading_log(self) -> list[tuple]:
        return self.events

    def absorb_grading_log(self, log: Any) -> None:
        """Replay here the calls the student's code made in the check's process (the ones not seen
        yet), so that `calls` and `problems` are the grader's own findings."""
        for event in log[len(self.events) :]:
            self.events.append(event)
            name, *args = event
            if name == "reset":
                self._reset(int(args[0]))
            elif name == "release":
                self._release(int(args[0]))
            elif name == "propose":
                self._propose(*args)
            else:
                raise ValueError(f"unknown drafter event {name!r}")

    def problem(self, text: str) -> None:
        if len(self.problems) < 3:
            self.problems.append(f"drafter call {self.calls}: {text}")

    def audit(self, slot: int, chunk: list[int], features: TargetFeatures, anchor: int) -> list[int] | None:
        """The true sequence of the request in `slot` if the loop's hand-over is right, else None."""
        if not self.history[slot]:
            if tuple(chunk) not in self.truth:
                self.problem(
                    f"the first call for slot {slot} must hand over the whole prompt, got {chunk[:8]}…"
                )
                return None
            self.sequence[slot] = self.truth[tuple(chunk)]
        history, seq = self.history[slot] + chunk, self.sequence[slot]
        self.history[slot] = history
        n = len(history)
        if history != seq[:n]:
            j = next((j for j, (a, b) in enumerate(zip(history, seq)) if a != b), min(n, len(seq)))
            self.problem(
                f"slot {slot}: the committed tokens handed over so far differ from prompt + output at position "
                f"{j} ({history[j] if j < n else '-'} vs {seq[j] if j < len(seq) else 'end'}); hand over only "
                "the anchor and the accepted drafts of the last round"
            )
            return None
        if n >= len(seq) or anchor != seq[n]:
            self.problem(
                f"slot {slot}: anchor {anchor} after {n} committed positions, expected "
                f"{seq[n] if n < len(seq) else 'none (the request had finished)'}"
            )
            return None
        if self.check_features and not self.features_match(seq[:n], chunk, features):
            self.problem(
                f"slot {slot}: the features handed over are not the target's at the committed positions "
                f"{n - len(chunk)}..{n - 1}; pass the features of the anchor + accepted drafts only"
            )
            return None
        return seq

    def features_match(self, sequence: list[int], chunk: list[int], features: TargetFeatures) -> bool:
        full = self._target[0](torch.tensor([sequence]), return_taps=True)
        taps = full.taps[0, len(sequence) - len(chunk) :]
        return features.taps.shape == taps.shape and bool(
            torch.allclose(features.taps, taps, atol=1e-3, rtol=1e-3)
        )

    @torch.no_grad()
    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        event = (
            slots.tolist(),
            committed_tokens,
            features.taps,
            features.last_hidden,
            committed_lens,
            anchors,
        )
        self.events.append(("propose", *[x.clone() if torch.is_tensor(x) else x for x in event], int(gamma)))
        return self._propose(*self.events[-1][1:])

    @torch.no_grad()
    def _propose(
        self, slots, committed_tokens, taps, last_hidden, committed_lens, anchors, gamma
    ) -> Proposal:
        features = TargetFeatures(taps, last_hidden)
        self.calls += 1
        n_total = int(committed_lens.sum())
        if committed_tokens.shape[0] != n_total or features.taps.shape[0] != n_total:
            self.problem(
                f"{committed_tokens.shape[0]} committed tokens and features for {features.taps.shape[0]} "
                f"positions, but committed_lens sums to {n_total}"
            )
        chunks = committed_tokens.split(committed_lens.tolist())
        feats = TargetFeatures(features.taps, features.last_hidden).split(committed_lens.tolist())
        drafts = []
        for slot, chunk, feat, anchor in zip(slots, chunks, feats, anchors.tolist()):
            seq = self.audit(slot, chunk.tolist(), feat, int(anchor)) or []
            n = len(self.history[slot])
            block = (seq[n + 1 : n + 1 + gamma] + [0] * gamma)[:gamma]
            for k in range(gamma):
                if float(torch.rand(1, generator=self.rng)) < self.noise:
                    block[k] = int(torch.randint(0, self.vocab, (1,), generator=self.rng))
            drafts.append(block)
        tokens = torch.tensor(drafts, dtype=torch.long).view(len(drafts), gamma)
        return Proposal(tokens, torch.nn.functional.one_hot(tokens, self.vocab).float())


@dataclass
class Pass:
    slots: list[int]
    block_lens: list[int]
    lengths_before: list[int]  # cache length of every slot just before the pass
    blocks: list[list[int]]  # the tokens appended to every slot


class PassRecorder(Probe):
    """Stands in for `target.forward_cached`: logs every pass, then runs it."""

    def __init__(self, target: Transformer) -> None:
        self.target = target
        self.passes: list[Pass] = []

    def __call__(self, tokens, slots, block_lens, cache, *args, **kwargs):
        self.passes.append(
            Pass(
                slots.tolist(),
                block_lens.tolist(),
                cache.lengths[slots].tolist(),
                [b.tolist() for b in tokens.split(block_lens.tolist())],
            )
        )
        return type(self.target).forward_cached(
            self.target, tokens, slots, block_lens, cache, *args, **kwargs
        )

    def grading_log(self) -> list[tuple]:
        return [(p.slots, p.block_lens, p.lengths_before, p.blocks) for p in self.passes]

    def absorb_grading_log(self, log: Any) -> None:
        for slots, block_lens, before, blocks in log[len(self.passes) :]:
            self.passes.append(
                Pass(_ints(slots), _ints(block_lens), _ints(before), [_ints(b) for b in blocks])
            )


def _ints(values) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError("a recorded pass holds something other than integers")
    return list(values)


def record_passes(target: Transformer) -> list[Pass]:
    """Log every `target.forward_cached` call from now on; the list fills in as the calls come back."""
    recorder = PassRecorder(target)
    target.forward_cached = recorder
    return recorder.passes
