"""Assignment 2's checks: the speculative round (DESIGN §1, §6, §8; dspark/engine.py).

`emit` on hand-worked blocks; then the student's `speculative_generate` at temperature 0
must be token-identical to plain greedy decoding (`dspark.decoding.generate`) on a tiny
random target with a drafter that knows the answer (`TruthDrafter`, a2_fixtures.py) and
with a random DSpark drafter, for verify lengths 0, 1, γ−1 and γ, with EOS and
max-new-tokens inside a block, and on the shipped model with the shipped DSpark drafter.
Around the same runs: what the drafter is handed each round, what every target pass
finds in the KV cache (prompt + emitted tokens except the anchor: the rollback was
right), and how many target passes there were (one per round for the whole batch).

What this file does not do: run anything itself (dspark/course/framework.py does).
"""

from __future__ import annotations

import math

import torch

from dspark.course.a2_fixtures import (
    GREEDY,
    TruthDrafter,
    ragged_prompts,
    record_passes,
    tiny_target,
    truths,
)
from dspark.course.framework import (
    Assignment,
    CheckFailed,
    CheckList,
    Probe,
    Solution,
    expect_equal,
    function,
    kind,
)
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.model import Transformer

checks = CheckList()


def run(
    solution: Solution,
    target: Transformer,
    drafter,
    prompts,
    max_new: int,
    gamma: int,
    eos_id: int | None = None,
    verify_len: int | None = None,
) -> list[list[int]]:
    """The student's speculative_generate at T = 0; the test doubles (a TruthDrafter, a target whose
    passes are recorded) bring back what they saw, and judge it here."""
    probes = [p for p in (drafter, vars(target).get("forward_cached")) if isinstance(p, Probe)]
    out = function(solution, "speculative_generate").observing(*probes)(
        target, drafter, prompts, max_new, gamma, GREEDY, torch.Generator().manual_seed(0), eos_id, verify_len
    )
    if not (isinstance(out, list) and len(out) == len(prompts) and all(isinstance(t, list) for t in out)):
        raise CheckFailed(
            f"speculative_generate should return one list of token ids per prompt, got {kind(out)}"
        )
    return out


def expect_identical(got: list[list[int]], want: list[list[int]], what: str) -> None:
    for r, (g, w) in enumerate(zip(got, want)):
        if g != w:
            j = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            raise CheckFailed(
                f"{what}: request {r} differs from plain greedy decoding at token {j} (got "
                f"{g[j] if j < len(g) else 'the end'}, expected {w[j] if j < len(w) else 'the end'}; "
                f"{len(g)} tokens, expected {len(w)}): at T = 0 it must reproduce the target's own output"
            )


@checks.add(points=2)
def emit_stops_at_eos_and_the_limit(solution: Solution) -> None:
    emit = function(solution, "emit")
    cases = [
        ([4], [5, 9, 2, 7], 10, 2, [4, 5, 9, 2], True, "EOS = 2 inside the block"),
        ([4], [5, 9, 2, 7], 3, None, [4, 5, 9], True, "the limit of 3 tokens inside the block"),
        ([], [1, 2, 3], 5, 9, [1, 2, 3], False, "no stop"),
        ([1], [2], 2, None, [1, 2], True, "the limit reached by the last token"),
        ([], [7, 8], 5, 7, [7], True, "EOS as the first token"),
    ]
    for before, new, limit, eos, after, finished, what in cases:
        # emit appends to `emitted`: with_arguments brings the list back as the call left it
        result, (emitted, *_) = emit.with_arguments(list(before), list(new), limit, eos)
        expect_equal(
            (emitted, bool(result)),
            (after, finished),
            f"emit({before}, {new}, max_new_tokens={limit}, eos_id={eos}) -> (emitted, finished) with {what}",
            "append one token at a time and stop right after EOS or at max_new_tokens",
        )


@checks.add(points=3)
def greedy_identity_tiny_target(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([3, 17, 1, 9, 12])
    want, truth = truths(target, prompts, 20)
    got = run(solution, target, TruthDrafter(target, truth, noise=0.3), prompts, 20, 4)
    expect_identical(got, want, "γ = 4, drafts right 70% of the time")


@checks.add(points=2)
def greedy_identity_dspark_drafter(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([4, 11, 2, 7], seed=1)
    torch.manual_seed(0)
    drafter = ParallelDrafter(
        target, ParallelDrafterConfig("dspark", gamma=3, ffn_hidden=64, rank=8, mask_id=5)
    )
    torch.nn.init.normal_(drafter.head.w2.weight, std=0.5)
    got = run(solution, target, drafter.eval(), prompts, 16, 3)
    expect_identical(got, truths(target, prompts, 16)[0], "a random DSpark drafter (its own KV cache), γ = 3")


@checks.add(points=2)
def drafter_gets_exactly_the_committed_tokens(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([5, 13, 8], seed=2)
    _, truth = truths(target, prompts, 18)
    drafter = TruthDrafter(target, truth, noise=0.4, seed=1, check_features=True)
    run(solution, target, drafter, prompts, 18, 4)
    if drafter.calls == 0:
        raise CheckFailed("drafter.propose was never called")
    if drafter.problems:
        raise CheckFailed(drafter.problems[0])


@checks.add(points=3)
def cache_holds_exactly_the_committed_tokens(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([6, 2, 15, 9], seed=3)
    _, truth = truths(target, prompts, 22)
    passes = record_passes(target)
    run(solution, target, TruthDrafter(target, truth, noise=0.3, seed=2), prompts, 22, 4)
    if len(passes) < 2:
        raise CheckFailed(
            f"saw {len(passes)} target.forward_cached pass(es): prefill, then one pass per round"
        )
    shadow: dict[int, list[int]] = {}  # what each cache slot holds, per the recorded passes
    owner: dict[int, list[int]] = {}  # slot -> prompt + output of the request using it
    for i, p in enumerate(passes):
        for slot, before, block in zip(p.slots, p.lengths_before, p.blocks):
            if before == 0:
                if tuple(block) not in truth:
                    raise CheckFailed(
                        f"target pass {i} fills empty slot {slot} with something that is not a prompt"
                    )
                owner[slot] = truth[tuple(block)]
            seq, kept = owner[slot], shadow.get(slot, [])[:before]
            if kept != seq[: len(kept)]:
                j = next(j for j, (a, b) in enumerate(zip(kept, seq)) if a != b)
                raise CheckFailed(
                    f"before target pass {i}, slot {slot} still holds token {kept[j]} at position {j} "
                    f"where prompt + output has {seq[j]}: roll back to the length before the pass + "
                    "accepted drafts + 1 (the anchor)"
                )
            if before >= len(seq) or block[0] != seq[before]:
                raise CheckFailed(
                    f"target pass {i}: slot {slot} holds {before} positions and its block starts with token "
                    f"{block[0]}, but position {before} of prompt + output is "
                    f"{seq[before] if before < len(seq) else 'past the end'}: after a round the cache must hold "
                    "exactly the prompt and every emitted token except the newest (the anchor), so roll back to "
                    "the length before the pass + accepted drafts + 1"
                )
            shadow[slot] = kept + block


@checks.add(points=2)
def one_target_pass_per_round(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([7, 3, 12, 5, 9], seed=4)
    gamma, max_new = 4, 17
    _, truth = truths(target, prompts, max_new)
    passes = record_passes(target)
    run(solution, target, TruthDrafter(target, truth), prompts, max_new, gamma)
    rounds = math.ceil((max_new - 1) / (gamma + 1))  # every draft is right: γ + 1 tokens per round
    if len(passes) != 1 + rounds:
        raise CheckFailed(
            f"target.forward_cached ran {len(passes)} times; 1 prefill + {rounds} rounds need "
            f"{1 + rounds} (every draft was right): one ragged pass serves every request of a round"
        )


@checks.add(points=2)
def eos_inside_a_block(solution: Solution) -> None:
    target, prompts, gamma = tiny_target(), ragged_prompts([5, 11, 2], seed=5), 6
    free = truths(target, prompts, 30)[0][1]
    eos = next(t for i, t in enumerate(free) if 2 <= i and i % (gamma + 1) != 0 and free.index(t) == i)
    want, truth = truths(target, prompts, 30, eos_id=eos)
    got = run(solution, target, TruthDrafter(target, truth), prompts, 30, gamma, eos_id=eos)
    expect_identical(got, want, f"EOS = {eos} arriving inside a block of {gamma + 1} accepted tokens")


@checks.add(points=2)
def max_new_tokens_inside_a_block(solution: Solution) -> None:
    target, prompts = tiny_target(), ragged_prompts([6, 3], seed=6)
    for max_new in (1, 2, 9, 13):
        want, truth = truths(target, prompts, max_new)
        got = run(solution, target, TruthDrafter(target, truth), prompts, max_new, 4)
        expect_identical(got, want, f"max_new_tokens = {max_new} with blocks of 5 accepted tokens")


@checks.add(points=2)
def verify_lengths_0_1_gamma_minus_1(solution: Solution) -> None:
    target, prompts, gamma = tiny_target(), ragged_prompts([4, 14, 8], seed=7), 4
    want, truth = truths(target, prompts, 15)
    for ell in (0, 1, gamma - 1):
        got = run(
            solution,
            target,
            TruthDrafter(target, truth, noise=0.3, seed=ell),
            prompts,
            15,
            gamma,
            verify_len=ell,
        )
        expect_identical(got, want, f"verify_len = {ell} of γ = {gamma}")


@checks.add(points=3)
def shipped_model_greedy_identity(solution: Solution) -> None:
    from dspark.checkpoint import TARGET_CHECKPOINT, TOKENIZER_PATH, load_target
    from dspark.drafters import get_drafter
    from dspark.lab.data.corpus import EVAL_PROMPTS_PATH, load_eval_prompts
    from dspark.tokenizer import Tokenizer

    target, _ = load_target(TARGET_CHECKPOINT)
    tokenizer = Tokenizer.load(TOKENIZER_PATH)
    prompts = [tokenizer.chat_prompt(r["prompt"]) for r in load_eval_prompts(EVAL_PROMPTS_PATH)[::80][:2]]
    got = run(solution, target, get_drafter("dspark", target), prompts, 24, 7, eos_id=tokenizer.eos_id)
    want = truths(target, prompts, 24, eos_id=tokenizer.eos_id)[0]
    expect_identical(got, want, "the shipped target with the shipped DSpark drafter, γ = 7")


ASSIGNMENT = Assignment(
    number=2,
    title="The speculative round",
    folder="a2_speculative_round",
    checks=tuple(checks.checks),
    reference="dspark.course.reference.a2_round",
)
