"""dspark/verify.py: verify = the reference rejection sampler: hand-worked cases, block boundaries (verify lengths
0, 1, γ-1, γ), greedy = argmax agreement, and statistical losslessness (chi-square) over ragged rounds."""

from __future__ import annotations

import pytest
import torch
from stats_helpers import assert_matches

from dspark.sampling import sample_from_probs
from dspark.verify import draw_uniforms, verify, verify_greedy

V = 5


def one_hot(i: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(i), V).float()


def test_hand_worked_accept_then_reject():
    # target for position 1: p = [0.5, 0.5, 0, 0, 0]; draft x1 = 1 with q1 = [0.2, 0.8, ...]
    p1 = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    q1 = torch.tensor([0.2, 0.8, 0.0, 0.0, 0.0])
    p2 = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    q2 = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0])
    bonus = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    tokens = torch.tensor([[1, 3]])
    dq = torch.stack([q1, q2])[None]
    tp = torch.stack([p1, p2, bonus])[None]
    lens = torch.tensor([2])
    # accept x1 iff u * 0.8 < 0.5, i.e. u < 0.625
    r = verify(tokens, dq, tp, lens, torch.tensor([[0.6, 0.0]]), torch.tensor([0.3]))
    assert r.accepted.tolist() == [1] and r.next_token.tolist() == [
        2
    ]  # x2 = 3 has p = 0: residual is one-hot 2
    r = verify(tokens, dq, tp, lens, torch.tensor([[0.7, 0.0]]), torch.tensor([0.3]))
    # rejected at 1: residual max(0, p1 - q1) = [0.3, 0, ...] -> token 0 whatever the uniform
    assert r.accepted.tolist() == [0] and r.next_token.tolist() == [0]


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_block_boundaries_verify_lens_0_1_gamma_minus_1_gamma(gamma):
    """Drafts equal to the target's one-hot choices are always accepted, up to ℓ; then the bonus."""
    target_seq = [(3 * i + 1) % V for i in range(gamma + 1)]
    tokens = torch.tensor([target_seq[:gamma]])
    tp = torch.stack([one_hot(t) for t in target_seq])[None]
    dq = tp[:, :gamma].clone()
    for ell in sorted({0, 1, gamma - 1, gamma}):
        r = verify(tokens, dq, tp, torch.tensor([ell]), torch.rand(1, gamma), torch.rand(1))
        assert r.accepted.tolist() == [ell]
        assert r.next_token.tolist() == [target_seq[ell]]  # bonus comes from p_ℓ, not p_γ


def test_gamma_zero_is_plain_sampling():
    tp = torch.softmax(torch.randn(3, 1, V), -1)
    u = torch.tensor([0.1, 0.5, 0.9])
    r = verify(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, V), tp, torch.zeros(3, dtype=torch.long),
               torch.zeros(3, 0), u)  # fmt: skip
    assert r.accepted.tolist() == [0, 0, 0]
    assert torch.equal(r.next_token, sample_from_probs(tp[:, 0], u))


def test_greedy_is_argmax_agreement():
    g = torch.Generator().manual_seed(0)
    R, gamma = 200, 4
    target_choice = torch.randint(0, V, (R, gamma + 1), generator=g)
    drafts = torch.where(
        torch.rand(R, gamma, generator=g) < 0.7,
        target_choice[:, :gamma],
        torch.randint(0, V, (R, gamma), generator=g),
    )
    tp = torch.nn.functional.one_hot(target_choice, V).float()
    dq = torch.nn.functional.one_hot(drafts, V).float()
    lens = torch.randint(0, gamma + 1, (R,), generator=g)
    r = verify(drafts, dq, tp, lens, *draw_uniforms(R, gamma, g))
    for i in range(R):
        a = 0
        while a < lens[i] and drafts[i, a] == target_choice[i, a]:
            a += 1
        assert r.accepted[i] == a and r.next_token[i] == target_choice[i, a]
    fast = verify_greedy(drafts, target_choice, lens)  # the engine's T = 0 path: argmax ids, no one-hots
    assert torch.equal(fast.accepted, r.accepted) and torch.equal(fast.next_token, r.next_token)


@pytest.mark.parametrize("gamma", [1, 2, 7])
def test_verify_greedy_equals_the_reference_on_one_hots_at_every_boundary(gamma):
    """ℓ = 0, 1, γ−1, γ for every request; drafts that agree up to a random point; target choices that are
    argmaxes of tied logits (the lowest id wins, in both paths)."""
    g = torch.Generator().manual_seed(gamma)
    R = 64
    logits = torch.randint(0, 2, (R, gamma + 1, V), generator=g).float()  # many ties
    top = logits.argmax(-1)  # (R, γ+1)
    agree = torch.randint(0, gamma + 1, (R, 1), generator=g)
    other = (top[:, :gamma] + torch.randint(1, V, (R, gamma), generator=g)) % V  # never the target's choice
    drafts = torch.where(torch.arange(gamma)[None] < agree, top[:, :gamma], other)
    for ell in sorted({0, 1, gamma - 1, gamma}):
        lens = torch.full((R,), ell)
        ref = verify(drafts, torch.nn.functional.one_hot(drafts, V).float(),
                     torch.nn.functional.one_hot(top, V).float(), lens, *draw_uniforms(R, gamma, g))  # fmt: skip
        fast = verify_greedy(drafts, top, lens)
        assert torch.equal(fast.accepted, ref.accepted) and torch.equal(fast.next_token, ref.next_token)
        assert torch.equal(fast.accepted, agree[:, 0].clamp(max=ell))
    with pytest.raises(AssertionError):
        verify_greedy(drafts, top[:, :gamma], torch.full((R,), gamma))


def test_a_target_pass_of_the_wrong_length_or_dtype_is_refused():
    """The contracts verify asserts: target_probs (R, γ+1, V) for drafts (R, γ), and p and q in fp32 (the dtype
    the tokens were drawn in; a bf16 q would be another distribution than the one sampled)."""
    drafts, q = torch.zeros(1, 2, dtype=torch.long), torch.full((1, 2, V), 0.2)
    draws = (torch.tensor([1]), torch.rand(1, 2), torch.rand(1))
    with pytest.raises(AssertionError):
        verify(drafts, q, torch.full((1, 2, V), 1 / V), *draws)
    with pytest.raises(AssertionError):
        verify(drafts, q.bfloat16(), torch.full((1, 3, V), 1 / V), *draws)
    verify(drafts, q, torch.full((1, 3, V), 1 / V), *draws)  # both right: accepted


# ---- statistical losslessness -------------------------------------------------------------
def _cases():
    g = torch.Generator().manual_seed(1)
    rand = lambda: torch.softmax(2 * torch.randn(V, generator=g), -1)  # noqa: E731
    p = rand()
    return {
        "p_equals_q": (p, p),
        "disjoint_supports": (torch.tensor([0.6, 0.4, 0, 0, 0]), torch.tensor([0, 0, 0.3, 0.3, 0.4])),
        "one_hot_target": (one_hot(2), rand()),
        "one_hot_draft": (rand(), one_hot(4)),
        "random": (rand(), rand()),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_first_token_follows_the_target(case):
    p, q = _cases()[case]
    g = torch.Generator().manual_seed(7)
    n = 100_000
    drafts = sample_from_probs(q.expand(n, V), torch.rand(n, generator=g))[:, None]
    tp = torch.stack([p, torch.full((V,), 1 / V)])  # position 1, then the bonus distribution
    r = verify(
        drafts,
        q.expand(n, 1, V),
        tp.expand(n, 2, V),
        torch.ones(n, dtype=torch.long),
        *draw_uniforms(n, 1, g),
    )
    first = torch.where(r.accepted > 0, drafts[:, 0], r.next_token)
    assert_matches(torch.bincount(first, minlength=V), p)


@pytest.mark.parametrize("case", ["disjoint_supports", "random", "p_equals_q"])
def test_multi_round_sequences_follow_the_target_with_ragged_lengths(case):
    """Many chains, each generated by repeated draft/verify rounds with random ℓ in 0..γ;
    the joint law of the first 3 tokens must be the product of the target's per-position laws."""
    g = torch.Generator().manual_seed(3)
    base_p, base_q = _cases()[case]
    L, gamma, n = 3, 3, 60_000
    shift = lambda x, k: x.roll(k)  # noqa: E731  position-dependent distributions
    P = torch.stack([shift(base_p, k) for k in range(L + gamma + 1)])  # (positions, V)
    Q = torch.stack([shift(base_q, 2 * k) for k in range(L + gamma + 1)])
    out = torch.full((n, L + gamma + 1), -1, dtype=torch.long)
    pos = torch.zeros(n, dtype=torch.long)
    rows = torch.arange(n)
    while bool((pos < L).any()):
        idx = pos.clamp(max=L)[:, None] + torch.arange(gamma + 1)  # (n, γ+1); finished chains idle
        dq = Q[idx[:, :gamma]]
        drafts = sample_from_probs(dq, torch.rand(n, gamma, generator=g))
        lens = torch.randint(0, gamma + 1, (n,), generator=g)
        r = verify(drafts, dq, P[idx], lens, *draw_uniforms(n, gamma, g))
        for k in range(gamma):
            take = (k < r.accepted) & (pos < L)
            out[rows[take], (pos + k)[take]] = drafts[take, k]
        done = pos < L
        out[rows[done], (pos + r.accepted)[done]] = r.next_token[done]
        pos = torch.where(done, pos + r.accepted + 1, pos)
    seq = out[:, :L]
    codes = (seq * torch.tensor([V * V, V, 1])).sum(1)
    joint = (P[0][:, None, None] * P[1][None, :, None] * P[2][None, None, :]).flatten()
    assert_matches(torch.bincount(codes, minlength=V**L), joint)
