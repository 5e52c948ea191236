"""The two sampling kernels against their PyTorch references, under Triton's CPU interpreter.

dspark_kernels/markov_sampler.py must equal `markov_block_reference` and
dspark_kernels/rejection_sampler.py must equal `verify_reference`: the same tokens and
accepted counts given the same uniforms (exactly), probabilities and confidences
to float32 round-off. Sizes are odd on purpose: vocabularies that are not powers
of two, γ = 1, verify length 0, one request and many."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from helpers import (  # noqa: E402
    GREEDY,
    TINY,  # noqa: E402
    make,  # noqa: E402
    prompts,
)
from stats_helpers import assert_matches  # noqa: E402

from dspark.drafters.parallel import markov_block_reference  # noqa: E402
from dspark.engine import speculative_generate  # noqa: E402
from dspark.sampling import SamplingParams  # noqa: E402
from dspark.verify import verify, verify_reference  # noqa: E402
from dspark_kernels import kernels_as
from dspark_kernels.markov_sampler import markov_block_sample_triton  # noqa: E402
from dspark_kernels.rejection_sampler import rejection_sample_triton  # noqa: E402


# ---- Markov-head block sampler --------------------------------------------------------------------
def markov_inputs(R, gamma, V, D, r, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        base_logits=torch.randn(R, gamma, V, generator=g) * scale,
        hidden=torch.randn(R, gamma, D, generator=g),
        anchors=torch.randint(V, (R,), generator=g),
        w1=torch.randn(V, r, generator=g),
        w2=torch.randn(V, r, generator=g),
        conf_weight=torch.randn(D + r, generator=g),
        conf_bias=torch.randn(1, generator=g),
        uniforms=torch.rand(R, gamma, generator=g),
    )


def run_both(inputs, temperature):
    kernel = markov_block_sample_triton(**inputs, temperature=temperature)
    reference = markov_block_reference(**inputs, params=SamplingParams(temperature=temperature))
    return kernel, reference


def assert_same_block(kernel, reference):
    assert torch.equal(kernel[0], reference[0])  # tokens: exactly
    torch.testing.assert_close(kernel[1], reference[1], atol=2e-6, rtol=0)  # probabilities
    torch.testing.assert_close(kernel[2], reference[2], atol=2e-6, rtol=0)  # confidences


MARKOV_CASES = [  # R, γ, V, D, r, temperature
    (1, 1, 5, 3, 1, 1.0),  # one request, γ = 1
    (1, 7, 97, 16, 8, 0.0),  # greedy
    (5, 4, 97, 16, 8, 0.7),
    (3, 7, 1001, 24, 5, 1.3),  # vocabulary far from a power of two
    (37, 3, 97, 8, 3, 1.0),  # many requests
]


@pytest.mark.parametrize("R, gamma, V, D, r, temperature", MARKOV_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_markov_kernel_matches_reference(R, gamma, V, D, r, temperature, seed):
    assert_same_block(*run_both(markov_inputs(R, gamma, V, D, r, seed), temperature))


def test_markov_kernel_reads_w2_through_its_strides():
    inputs = markov_inputs(3, 4, 97, 8, 5, seed=2)
    kernel, reference = run_both(inputs, 1.0)
    transposed = markov_block_sample_triton(
        **{**inputs, "w2": inputs["w2"].t().contiguous().t()}, temperature=1.0
    )
    assert_same_block(transposed, reference)
    assert_same_block(kernel, reference)


def test_markov_kernel_hand_worked_chain():
    # W2 W1[x] puts +10 on token x+1 (mod V): greedy drafts count up from the anchor;
    # w = 0, b = 0 make every confidence σ(0) = 1/2.
    V, gamma = 7, 5
    inputs = markov_inputs(2, gamma, V, 4, V)
    inputs.update(
        base_logits=torch.zeros(2, gamma, V),
        anchors=torch.tensor([0, 5]),
        w1=torch.eye(V),
        w2=10 * torch.roll(torch.eye(V), 1, dims=0),  # column x has its 10 at row x + 1
        conf_weight=torch.zeros(4 + V),
        conf_bias=torch.zeros(1),
    )
    tokens, probs, conf = markov_block_sample_triton(**inputs, temperature=0.0)
    assert tokens.tolist() == [[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]]
    assert torch.equal(probs.sum(-1), torch.ones(2, gamma))
    assert torch.equal(conf, torch.full((2, gamma), 0.5))


def test_markov_kernel_greedy_ties_go_to_the_lowest_id():
    inputs = markov_inputs(3, 2, 11, 4, 2)
    inputs.update(base_logits=torch.zeros(3, 2, 11), w2=torch.zeros(11, 2))  # every logit equal
    kernel, reference = run_both(inputs, 0.0)
    assert kernel[0].eq(0).all()
    assert_same_block(kernel, reference)


def test_markov_kernel_never_draws_a_zero_probability_token():
    inputs = markov_inputs(4, 3, 13, 4, 2)
    inputs["base_logits"][..., -3:] = float("-inf")  # the last three tokens are impossible
    inputs["uniforms"] = torch.full((4, 3), 1 - 2**-24)  # the largest float32 below 1
    kernel, reference = run_both(inputs, 1.0)
    assert bool((kernel[0] < 10).all())
    assert_same_block(kernel, reference)


def test_markov_kernel_empty_block_and_bad_inputs():
    tokens, probs, conf = markov_block_sample_triton(**markov_inputs(3, 0, 9, 4, 2), temperature=1.0)
    assert tokens.shape == (3, 0) and probs.shape == (3, 0, 9) and conf.shape == (3, 0)
    inputs = markov_inputs(2, 3, 9, 4, 2)
    with pytest.raises(ValueError, match="float32"):
        markov_block_sample_triton(
            **{**inputs, "base_logits": inputs["base_logits"].double()}, temperature=1.0
        )
    with pytest.raises(ValueError, match="contiguous"):
        markov_block_sample_triton(**{**inputs, "uniforms": torch.rand(3, 2).T}, temperature=1.0)
    with pytest.raises(ValueError, match="shape"):
        markov_block_sample_triton(**{**inputs, "anchors": torch.zeros(3, dtype=torch.long)}, temperature=1.0)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "T=1"])
def test_dspark_drafter_decodes_the_same_with_the_kernels(tiny_model, params):
    """The whole speculative loop, every hot path on its kernel vs every one on its reference."""
    drafter = make(tiny_model, "dspark", gamma=3)
    ps = prompts([4, 9, 1])
    outputs = {}
    for mode in ("triton", "reference"):
        with kernels_as(mode):
            result = speculative_generate(
                tiny_model, drafter, ps, 10, params, 3, torch.Generator().manual_seed(5)
            )
        outputs[mode] = (result.tokens, result.from_draft)
    assert outputs["triton"] == outputs["reference"]


# ---- rejection sampler ----------------------------------------------------------------------------
def verify_inputs(R, gamma, V, seed=0, same=False, disjoint=False):
    g = torch.Generator().manual_seed(seed)
    draft_probs = torch.softmax(torch.randn(R, gamma, V, generator=g) * 2, -1)
    target_probs = torch.softmax(torch.randn(R, gamma + 1, V, generator=g) * 2, -1)
    if same:  # p = q: every verified draft is accepted
        target_probs[:, :gamma] = draft_probs
    if disjoint:  # q on the first half, p on the second: every draft is rejected
        draft_probs[..., V // 2 :] = 0
        target_probs[..., : V // 2] = 0
        draft_probs /= draft_probs.sum(-1, keepdim=True)
        target_probs /= target_probs.sum(-1, keepdim=True)
    flat = draft_probs.reshape(-1, V)
    drafts = torch.multinomial(flat, 1, generator=g).reshape(R, gamma) if gamma else torch.zeros(R, 0).long()
    verify_lens = torch.arange(R) % (gamma + 1)  # 0, 1, ..., γ, 0, 1, ...: both ends of the block
    return (
        drafts,
        draft_probs,
        target_probs,
        verify_lens,
        torch.rand(R, gamma, generator=g),
        torch.rand(R, generator=g),
    )


VERIFY_CASES = [(1, 1, 5), (1, 4, 97), (5, 4, 97), (3, 7, 1001), (37, 3, 97), (4, 0, 7)]  # R, γ, V


@pytest.mark.parametrize("R, gamma, V", VERIFY_CASES)
@pytest.mark.parametrize("kind", ["random", "same", "disjoint"])
def test_rejection_kernel_matches_reference(R, gamma, V, kind):
    for seed in range(3):
        args = verify_inputs(R, gamma, V, seed, same=kind == "same", disjoint=kind == "disjoint")
        accepted, next_token = rejection_sample_triton(*args)
        expected = verify_reference(*args)
        assert torch.equal(accepted, expected.accepted)
        assert torch.equal(next_token, expected.next_token)
        if kind == "same":
            assert torch.equal(accepted, args[3])
        if kind == "disjoint":
            assert accepted.eq(0).all()


def test_rejection_kernel_hand_worked():
    # one draft x=1 with q(1)=0.8, p(1)=0.2: accepted iff u·0.8 < 0.2, i.e. u < 0.25;
    # the residual max(0, p - q) = (0.5, 0, 0.1)/0.6 -> token 0 for u < 5/6, else token 2.
    q = torch.tensor([[[0.1, 0.8, 0.1]]])
    p = torch.tensor([[[0.6, 0.2, 0.2], [0.0, 0.0, 1.0]]])
    drafts, lens = torch.tensor([[1]]), torch.tensor([1])
    for u_accept, u_resample, want in [
        (0.2, 0.1, (1, 2)),
        (0.3, 0.1, (0, 0)),
        (0.3, 0.8, (0, 0)),
        (0.3, 0.9, (0, 2)),
    ]:
        accepted, token = rejection_sample_triton(
            drafts, q, p, lens, torch.tensor([[u_accept]]), torch.tensor([u_resample])
        )
        assert (int(accepted), int(token)) == want


def test_rejection_kernel_output_follows_the_target_law():
    """Statistical losslessness of the kernel alone: 2,000 requests in one launch, γ = 2,
    verify length 1; the first emitted token must follow p_0 whatever q was."""
    R, V = 2000, 5
    g = torch.Generator().manual_seed(3)
    q = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    p = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.4])
    draft_probs = q.expand(R, 2, V).contiguous()
    target_probs = p.expand(R, 3, V).contiguous()
    drafts = torch.multinomial(q, 2 * R, replacement=True, generator=g).view(R, 2)
    accepted, token = rejection_sample_triton(
        drafts,
        draft_probs,
        target_probs,
        torch.ones(R, dtype=torch.long),
        torch.rand(R, 2, generator=g),
        torch.rand(R, generator=g),
    )
    first = torch.where(accepted > 0, drafts[:, 0], token)
    assert_matches(torch.bincount(first, minlength=V), p)
    assert 0 < int(accepted.sum()) < R


def test_rejection_kernel_checks_inputs():
    args = list(verify_inputs(3, 2, 9))
    with pytest.raises(ValueError, match="float32"):
        rejection_sample_triton(*args[:1], args[1].double(), *args[2:])
    with pytest.raises(ValueError, match="contiguous"):
        rejection_sample_triton(*args[:4], torch.rand(2, 3).T, args[5])
    with pytest.raises(ValueError, match="shape"):
        rejection_sample_triton(*args[:3], torch.zeros(4, dtype=torch.long), *args[4:])


def test_verify_dispatches_to_the_kernel_when_forced():
    args = verify_inputs(6, 3, TINY.vocab_size, seed=4)
    with kernels_as("triton"):
        forced = verify(*args)
    with kernels_as("reference"):
        plain = verify(*args)
    assert torch.equal(forced.accepted, plain.accepted) and torch.equal(forced.next_token, plain.next_token)
