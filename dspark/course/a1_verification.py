"""Assignment 1's checks: lossless verification (`residual`, `verify`; DESIGN §8).

Hand-worked cases first, then the structural cases the brief lists (p = q, disjoint
supports, one-hot greedy inputs, verify lengths 0/1/γ−1/γ in one batch, γ = 0), then
agreement with `dspark.verify.verify_reference` for the same uniforms, and last a
chi-square test that the first output token follows the target's law.

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
    kind,
)
from dspark.lab.study.stats import chi_square, chi_square_critical
from dspark.sampling import sample_from_probs
from dspark.verify import draw_uniforms, verify_reference

V = 5
checks = CheckList()


def one_hot(ids, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.as_tensor(ids), vocab).float()


def random_probs(*shape: int, generator: torch.Generator, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(sharp * torch.randn(*shape, generator=generator), -1)


def run_verify(solution: Solution, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's verify, its outputs checked for type and shape."""
    out = function(solution, "verify")(*args)  # on copies, in the check's process
    if not (isinstance(out, tuple) and len(out) == 2):
        raise CheckFailed(f"verify should return a tuple (accepted, next_token), got {kind(out)}")
    R = args[0].shape[0]
    accepted = expect_tensor(out[0], "accepted", (R,))
    next_token = expect_tensor(out[1], "next_token", (R,))
    return accepted.long(), next_token.long()


@checks.add(points=2)
def residual_hand_worked(solution: Solution) -> None:
    residual = function(solution, "residual")
    p, q = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0]), torch.tensor([0.2, 0.8, 0.0, 0.0, 0.0])
    got = expect_tensor(residual(p, q), "residual(p, q)", (V,))
    expect_close(
        got,
        torch.tensor([1.0, 0, 0, 0, 0]),
        "residual([.5,.5,0,0,0], [.2,.8,0,0,0])",
        hint="max(0, p − q) = [.3, 0, 0, 0, 0], normalised",
    )
    p, q = torch.tensor([0.4, 0.3, 0.3]), torch.tensor([0.1, 0.1, 0.8])
    got = expect_tensor(residual(p, q), "residual(p, q)", (3,))
    expect_close(
        got,
        torch.tensor([0.6, 0.4, 0.0]),
        "residual([.4,.3,.3], [.1,.1,.8])",
        hint="max(0, p − q) = [.3, .2, 0], divided by its mass .5",
    )


@checks.add(points=1)
def residual_is_normalised(solution: Solution) -> None:
    g = torch.Generator().manual_seed(0)
    p, q = random_probs(4, 3, 7, generator=g), random_probs(4, 3, 7, generator=g)
    got = expect_tensor(function(solution, "residual")(p, q), "residual(p, q)", (4, 3, 7))
    sums = got.sum(-1)
    worst = int((sums - 1).abs().flatten().argmax())
    if abs(float(sums.flatten()[worst]) - 1) > 1e-4:
        raise CheckFailed(
            f"a row of residual(p, q) sums to {float(sums.flatten()[worst]):.4f}, not 1: "
            "divide max(0, p − q) by its total mass"
        )
    expected = (p - q).clamp_min(0)
    expect_close(
        got,
        expected / expected.sum(-1, keepdim=True),
        "residual(p, q) on (4, 3, 7) random rows",
        hint="every row on its own: norm(max(0, p − q)) over the last dimension",
    )


@checks.add(points=1)
def residual_when_p_equals_q(solution: Solution) -> None:
    p = random_probs(2, V, generator=torch.Generator().manual_seed(1))
    got = expect_tensor(function(solution, "residual")(p, p.clone()), "residual(p, p)", (2, V))
    expect_close(
        got, p, "residual(p, p)", hint="max(0, p − q) has no mass here: return p, do not divide by 0"
    )


@checks.add(points=2)
def hand_worked_accept_then_reject(solution: Solution) -> None:
    """Target for position 1 p = [.5, .5, 0, 0, 0]; draft x1 = 1 from q1 = [.2, .8, 0, 0, 0]."""
    p1, q1 = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0]), torch.tensor([0.2, 0.8, 0.0, 0.0, 0.0])
    p2, q2, bonus = one_hot(2), one_hot(3), one_hot(4)
    tokens, dq, tp = torch.tensor([[1, 3]]), torch.stack([q1, q2])[None], torch.stack([p1, p2, bonus])[None]
    # accept x1 iff u·0.8 < 0.5 (u < 0.625); x2 = 3 has p = 0: rejected, the residual is one-hot on 2
    accepted, nxt = run_verify(
        solution, tokens, dq, tp, torch.tensor([2]), torch.tensor([[0.6, 0.0]]), torch.tensor([0.3])
    )
    expect_equal(
        (accepted.tolist(), nxt.tolist()),
        ([1], [2]),
        "(accepted, next_token) with u1 = 0.6",
        "0.6·0.8 < 0.5 accepts x1; x2 = 3 has p = 0, so the residual is one-hot on token 2",
    )
    accepted, nxt = run_verify(
        solution, tokens, dq, tp, torch.tensor([2]), torch.tensor([[0.7, 0.0]]), torch.tensor([0.3])
    )
    expect_equal(
        (accepted.tolist(), nxt.tolist()),
        ([0], [0]),
        "(accepted, next_token) with u1 = 0.7",
        "0.7·0.8 ≥ 0.5 rejects x1; the residual max(0, p1 − q1) is one-hot on token 0",
    )


@checks.add(points=2)
def p_equals_q_accepts_every_draft(solution: Solution) -> None:
    g = torch.Generator().manual_seed(2)
    R, gamma = 3, 3
    tp = random_probs(R, gamma + 1, V, generator=g)
    dq = tp[:, :gamma].clone()
    drafts = sample_from_probs(dq, torch.rand(R, gamma, generator=g))
    u_acc, u_res = draw_uniforms(R, gamma, g)
    accepted, nxt = run_verify(solution, drafts, dq, tp, torch.full((R,), gamma), u_acc, u_res)
    expect_equal(accepted.tolist(), [gamma] * R, "accepted counts with q = p", "u·q(x) < p(x) always holds")
    expect_equal(
        nxt.tolist(),
        sample_from_probs(tp[:, gamma], u_res).tolist(),
        "bonus tokens with q = p",
        "all ℓ drafts survived: draw the bonus from target_probs[:, ℓ] with resample_uniforms",
    )


@checks.add(points=2)
def disjoint_supports_reject_at_once(solution: Solution) -> None:
    p, q = torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.3, 0.3, 0.4])
    R, gamma = 4, 2
    drafts = torch.tensor([[2, 3], [4, 4], [3, 2], [2, 2]])
    u_res = torch.tensor([0.1, 0.5, 0.7, 0.99])
    accepted, nxt = run_verify(
        solution,
        drafts,
        q.expand(R, gamma, V).clone(),
        p.expand(R, gamma + 1, V).clone(),
        torch.full((R,), gamma),
        torch.rand(R, gamma),
        u_res,
    )
    expect_equal(accepted.tolist(), [0] * R, "accepted counts when q has no mass where p has", "p(x1) = 0")
    expect_equal(
        nxt.tolist(),
        sample_from_probs(p.expand(R, V), u_res).tolist(),
        "replacement tokens",
        "the residual max(0, p − q) is p itself here",
    )


@checks.add(points=2)
def greedy_one_hot_is_argmax_agreement(solution: Solution) -> None:
    g = torch.Generator().manual_seed(0)
    R, gamma = 200, 4
    choice = torch.randint(0, V, (R, gamma + 1), generator=g)  # the target's argmax at every position
    agree = torch.rand(R, gamma, generator=g) < 0.7
    drafts = torch.where(agree, choice[:, :gamma], torch.randint(0, V, (R, gamma), generator=g))
    lens = torch.randint(0, gamma + 1, (R,), generator=g)
    accepted, nxt = run_verify(
        solution, drafts, one_hot(drafts), one_hot(choice), lens, *draw_uniforms(R, gamma, g)
    )
    for i in range(R):
        a = 0
        while a < lens[i] and drafts[i, a] == choice[i, a]:
            a += 1
        if (int(accepted[i]), int(nxt[i])) != (a, int(choice[i, a])):
            raise CheckFailed(
                f"greedy request {i} (drafts {drafts[i].tolist()}, target argmax {choice[i].tolist()}, ℓ = "
                f"{int(lens[i])}): got accepted {int(accepted[i])}, next {int(nxt[i])}; expected {a}, "
                f"{int(choice[i, a])}: with one-hot p and q a draft survives iff it is the target's argmax"
            )


@checks.add(points=3)
def verify_lengths_0_1_gamma_minus_1_gamma(solution: Solution) -> None:
    """One batch, one request per verify length; every draft is the target's one-hot choice."""
    gamma = 4
    lens = [0, 1, gamma - 1, gamma]
    seq = torch.tensor([[(3 * i + r + 1) % V for i in range(gamma + 1)] for r in range(len(lens))])
    tp = one_hot(seq)
    accepted, nxt = run_verify(
        solution,
        seq[:, :gamma],
        tp[:, :gamma].clone(),
        tp,
        torch.tensor(lens),
        torch.rand(len(lens), gamma),
        torch.rand(len(lens)),
    )
    expect_equal(
        accepted.tolist(),
        lens,
        "accepted for ℓ = 0, 1, γ−1, γ (all drafts correct)",
        "drafts beyond verify_lens[r] are never examined",
    )
    expect_equal(
        nxt.tolist(),
        [int(seq[r, ell]) for r, ell in enumerate(lens)],
        "bonus tokens for ℓ = 0, 1, γ−1, γ",
        "the bonus comes from target_probs[r, ℓ_r], not from row γ",
    )


@checks.add(points=1)
def zero_drafts_is_plain_sampling(solution: Solution) -> None:
    g = torch.Generator().manual_seed(4)
    tp = random_probs(3, 1, V, generator=g)
    u = torch.tensor([0.1, 0.5, 0.9])
    accepted, nxt = run_verify(
        solution,
        torch.zeros(3, 0, dtype=torch.long),
        torch.zeros(3, 0, V),
        tp,
        torch.zeros(3, dtype=torch.long),
        torch.zeros(3, 0),
        u,
    )
    expect_equal(accepted.tolist(), [0, 0, 0], "accepted with γ = 0")
    expect_equal(
        nxt.tolist(),
        sample_from_probs(tp[:, 0], u).tolist(),
        "next tokens with γ = 0",
        "γ = 0 is one plain decoding step: a draw from target_probs[:, 0]",
    )


@checks.add(points=2)
def same_as_reference_for_the_same_uniforms(solution: Solution) -> None:
    g = torch.Generator().manual_seed(5)
    R, gamma, vocab = 64, 5, 7
    dq, tp = random_probs(R, gamma, vocab, generator=g), random_probs(R, gamma + 1, vocab, generator=g)
    drafts = sample_from_probs(dq, torch.rand(R, gamma, generator=g))
    lens = torch.randint(0, gamma + 1, (R,), generator=g)
    u_acc, u_res = draw_uniforms(R, gamma, g)
    accepted, nxt = run_verify(solution, drafts, dq, tp, lens, u_acc, u_res)
    ref = verify_reference(drafts, dq, tp, lens, u_acc, u_res)
    for name, got, want in (("accepted", accepted, ref.accepted), ("next_token", nxt, ref.next_token)):
        bad = (got != want).nonzero().flatten()
        if len(bad):
            r = int(bad[0])
            raise CheckFailed(
                f"{name} of request {r} (ℓ = {int(lens[r])}) is {int(got[r])}, the reference gives {int(want[r])} "
                f"({len(bad)} of {R} requests differ): accept iff u_k·q_k(x_k) < p_(k−1)(x_k), and draw the "
                "final token with resample_uniforms[r] only"
            )


@checks.add(points=3)
def first_token_follows_the_target(solution: Solution) -> None:
    """Chi-square: draw x1 ~ q, verify it (ℓ = 1); the first output token must follow p."""
    g = torch.Generator().manual_seed(1)
    rand = lambda: random_probs(V, generator=g)  # noqa: E731
    p = rand()
    cases = {
        "p = q": (p, p),
        "disjoint supports": (torch.tensor([0.6, 0.4, 0, 0, 0]), torch.tensor([0, 0, 0.3, 0.3, 0.4])),
        "one-hot target": (one_hot(2), rand()),
        "one-hot draft": (rand(), one_hot(4)),
        "random": (rand(), rand()),
    }
    n = 40_000
    for name, (p, q) in cases.items():
        drafts = sample_from_probs(q.expand(n, V), torch.rand(n, generator=g))[:, None]
        tp = torch.stack([p, torch.full((V,), 1 / V)]).expand(n, 2, V)
        accepted, nxt = run_verify(
            solution, drafts, q.expand(n, 1, V), tp, torch.ones(n, dtype=torch.long), *draw_uniforms(n, 1, g)
        )
        first = torch.where(accepted > 0, drafts[:, 0], nxt)
        counts = torch.bincount(first.clamp(0, V - 1), minlength=V)
        stat, df = chi_square(counts, p)
        if stat >= chi_square_critical(df):
            raise CheckFailed(
                f"case '{name}': the first token's frequencies {show_freq(counts)} do not follow the target "
                f"{show_freq(p * n)} (chi-square {stat:.1f}, df {df}): the output law must be exactly p"
            )


def show_freq(counts: torch.Tensor) -> str:
    return str([round(float(c) / float(counts.sum()), 3) for c in counts])


ASSIGNMENT = Assignment(
    number=1,
    title="Lossless verification",
    folder="a1_verification",
    checks=tuple(checks.checks),
    reference="dspark.course.reference.a1_verification",
)
