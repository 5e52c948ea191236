"""Assignment 3's checks: the anchor-first block and the Markov sequential head (DESIGN §2).

The block's tokens, positions and attention mask (hand-worked, ragged contexts), the
draft distribution q at a temperature and at T = 0 (ties to the lowest id), one Markov
step, and whole blocks against `dspark.drafters.parallel.markov_block_reference` on
random weights with injected uniforms: the same tokens, q and confidences, at T = 0.8
and greedy, for γ = 1, and every token drawn from the very q returned for it.

What this file does not do: run anything itself (dspark/course/framework.py does).
"""

from __future__ import annotations

import torch

from dspark.course.framework import (
    Assignment,
    CheckFailed,
    CheckList,
    Solution,
    expect_close,
    expect_equal,
    expect_tensor,
    function,
)
from dspark.drafters.parallel import markov_block_reference, markov_step
from dspark.sampling import SamplingParams, probabilities, sample_from_probs

checks = CheckList()


def random_head(R: int = 4, gamma: int = 5, V: int = 11, D: int = 6, r: int = 4, seed: int = 0) -> dict:
    """Backbone outputs and Markov/confidence weights strong enough that every term matters."""
    g = torch.Generator().manual_seed(seed)
    return {
        "base_logits": 2 * torch.randn(R, gamma, V, generator=g),
        "hidden": torch.randn(R, gamma, D, generator=g),
        "anchors": torch.randint(0, V, (R,), generator=g),
        "w1": torch.randn(V, r, generator=g),
        "w2": torch.randn(V, r, generator=g),
        "conf_weight": torch.randn(D + r, generator=g),
        "conf_bias": torch.randn(1, generator=g),
    }


def run_block(solution: Solution, head: dict, temperature: float, uniforms: torch.Tensor):
    """(student's (tokens, q, conf), reference's) for one block."""
    R, gamma, V = head["base_logits"].shape
    out = function(solution, "markov_block")(
        *[t.clone() for t in head.values()], temperature, uniforms.clone()
    )
    if not (isinstance(out, tuple) and len(out) == 3):
        raise CheckFailed("markov_block should return a tuple (tokens, q, confidence)")
    got = (
        expect_tensor(out[0], "tokens", (R, gamma)).long(),
        expect_tensor(out[1], "q", (R, gamma, V)),
        expect_tensor(out[2], "confidence", (R, gamma)),
    )
    return got, markov_block_reference(*head.values(), SamplingParams(temperature=temperature), uniforms)


def compare_tokens(got: torch.Tensor, want: torch.Tensor, what: str, hint: str) -> None:
    bad = (got != want).nonzero()
    if len(bad):
        r, k = bad[0].tolist()
        raise CheckFailed(
            f"{what}: request {r}, slot {k} drafted {int(got[r, k])}, the reference {int(want[r, k])}; {hint}"
        )


@checks.add(points=2)
def anchor_first_block(solution: Solution) -> None:
    block = function(solution, "anchor_block")
    for gamma, tokens, positions in (
        (3, [[7, 5, 5], [3, 5, 5]], [[4, 5, 6], [0, 1, 2]]),
        (1, [[7], [3]], [[4], [0]]),
    ):
        out = block(torch.tensor([7, 3]), torch.tensor([4, 0]), gamma, 5)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise CheckFailed("anchor_block should return a tuple (tokens, positions)")
        expect_equal(
            expect_tensor(out[0], "block tokens", (2, gamma)).tolist(),
            tokens,
            f"block tokens for anchors [7, 3], γ = {gamma}, MASK = 5",
            "[anchor, MASK × (γ−1)]",
        )
        expect_equal(
            expect_tensor(out[1], "block positions", (2, gamma)).tolist(),
            positions,
            f"block positions for context lengths [4, 0], γ = {gamma}",
            "the anchor sits at position context_len, slot k at context_len + k",
        )


@checks.add(points=2)
def visibility_hand_worked(solution: Solution) -> None:
    got = function(solution, "block_visibility")(torch.tensor([2, 4, 0]), 2)
    got = expect_tensor(got, "block_visibility(context_lens = [2, 4, 0], γ = 2)", (3, 2, 6))
    rows = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]]  # context 0..3 | block slots 0..1
    expected = torch.tensor(rows, dtype=torch.bool)[:, None, :].expand(3, 2, 6)
    wrong = (got.bool() != expected).nonzero()
    if len(wrong):
        r, slot, col = wrong[0].tolist()
        column = f"context position {col}" if col < 4 else f"block slot {col - 4}"
        raise CheckFailed(
            f"block_visibility([2, 4, 0], γ = 2): request {r} (context length {[2, 4, 0][r]}), slot {slot}, "
            f"{column}: got {bool(got[r, slot, col])}, expected {bool(expected[r, slot, col])}; a slot sees the "
            "context positions < context_len[r] (strictly before the anchor) and all γ slots of its block"
        )


@checks.add(points=2)
def draft_probs_at_a_temperature(solution: Solution) -> None:
    logits = 2 * torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    q = function(solution, "draft_probs")
    for t in (1.0, 0.5, 2.0):
        got = expect_tensor(q(logits.clone(), t), f"draft_probs(logits, {t})", (3, 7), torch.float32)
        expect_close(
            got,
            probabilities(logits, SamplingParams(temperature=t)),
            f"draft_probs(logits, T = {t})",
            atol=1e-6,
            hint="q = softmax(logits / T): divide the LOGITS, then normalise",
        )


@checks.add(points=2)
def greedy_ties_go_to_the_lowest_id(solution: Solution) -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    got = expect_tensor(function(solution, "draft_probs")(logits, 0.0), "draft_probs(logits, 0)", (2, 4))
    expect_equal(
        got.tolist(),
        [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
        "draft_probs([[1, 3, 3, 0], [5, 5, 5, 5]], 0)",
        "T = 0 is one-hot on the argmax, ties to the lowest token id",
    )
    head = random_head(R=2, gamma=3, V=4)
    head["base_logits"] = torch.tensor([1.0, 3.0, 3.0, 0.0]).expand(2, 3, 4).clone()
    head["w2"] = torch.zeros_like(head["w2"])  # no sequential term: every slot is the tie
    (tokens, _, _), _ = run_block(solution, head, 0.0, torch.rand(2, 3))
    expect_equal(
        tokens.tolist(),
        [[1, 1, 1], [1, 1, 1]],
        "greedy block over tied logits [1, 3, 3, 0]",
        "T = 0 drafts the lowest id among the tied argmaxes",
    )


@checks.add(points=2)
def markov_step_matches_reference(solution: Solution) -> None:
    head = random_head(R=3)
    args = (
        head["base_logits"][:, 0],
        head["hidden"][:, 0],
        head["anchors"],
        head["w1"],
        head["w2"],
        head["conf_weight"],
        head["conf_bias"],
    )
    out = function(solution, "markov_step")(*[a.clone() for a in args])
    if not (isinstance(out, tuple) and len(out) == 2):
        raise CheckFailed("markov_step should return a tuple (logits, confidence)")
    want_logits, want_conf = markov_step(*args)
    expect_close(
        expect_tensor(out[0], "step logits", (3, 11)),
        want_logits,
        "markov_step logits",
        atol=1e-4,
        hint="U_k + W1[x_{k−1}] @ w2.T",
    )
    expect_close(
        expect_tensor(out[1], "step confidence", (3,)),
        want_conf,
        "markov_step confidence",
        atol=1e-5,
        hint="σ(wᵀ[h_k ; W1[x_{k−1}]] + b)",
    )


@checks.add(points=3)
def block_tokens_and_q_match_reference(solution: Solution) -> None:
    head = random_head()
    uniforms = torch.rand(4, 5, generator=torch.Generator().manual_seed(2))
    (tokens, q, _), (want_tokens, want_q, _) = run_block(solution, head, 0.8, uniforms)
    compare_tokens(
        tokens,
        want_tokens,
        "block at T = 0.8",
        "slot k is drawn from softmax((U_k + W2·W1[x_{k−1}]) / T) with uniforms[:, k], x_0 = anchor",
    )
    expect_close(
        q, want_q, "q of the block at T = 0.8", atol=1e-5, hint="return the q each token was drawn from"
    )


@checks.add(points=2)
def confidence_matches_reference(solution: Solution) -> None:
    head = random_head(seed=3)
    (_, _, conf), (_, _, want_conf) = run_block(solution, head, 1.0, torch.rand(4, 5))
    expect_close(
        conf.float(),
        want_conf,
        "block confidences",
        atol=1e-5,
        hint="c_k reads h_k and W1[x_{k−1}], the token BEFORE slot k (the anchor for k = 1)",
    )


@checks.add(points=2)
def greedy_block_matches_reference(solution: Solution) -> None:
    head = random_head(seed=4)
    (tokens, q, _), (want_tokens, want_q, _) = run_block(solution, head, 0.0, torch.rand(4, 5))
    compare_tokens(tokens, want_tokens, "greedy block", "at T = 0 slot k is argmax(U_k + W2·W1[x_{k−1}])")
    expect_close(q, want_q, "q of the greedy block", atol=0, hint="one-hot rows at T = 0")


@checks.add(points=2)
def gamma_one_conditions_on_the_anchor(solution: Solution) -> None:
    for seed in (5, 6):
        head = random_head(R=6, gamma=1, seed=seed)
        head["anchors"] = torch.arange(6)
        (tokens, q, conf), (want_tokens, want_q, want_conf) = run_block(
            solution, head, 1.0, torch.full((6, 1), 0.5)
        )
        compare_tokens(tokens, want_tokens, "γ = 1 block", "the only slot reads W1[anchor]")
        expect_close(q, want_q, "q of a γ = 1 block", atol=1e-5, hint="the only slot reads W1[anchor]")
        expect_close(conf.float(), want_conf, "confidence of a γ = 1 block", atol=1e-5)


@checks.add(points=2)
def tokens_are_drawn_from_the_returned_q(solution: Solution) -> None:
    head = random_head(R=8, gamma=6, seed=7)
    uniforms = torch.rand(8, 6, generator=torch.Generator().manual_seed(8))
    (tokens, q, _), _ = run_block(solution, head, 1.3, uniforms)
    expect_equal(
        tokens,
        sample_from_probs(q.float(), uniforms),
        "tokens vs sample_from_probs(your q, uniforms)",
        "each draft must be drawn, with its own uniform, from exactly the q you return for it",
    )


ASSIGNMENT = Assignment(
    number=3,
    title="Parallel drafting and the Markov head",
    folder="a3_markov_head",
    checks=tuple(checks.checks),
    reference="dspark.course.reference.a3_markov",
)
