"""The speculative loop: token-identical to plain greedy decoding for every drafter and
verify length, EOS and max-new-tokens inside a block, and exact sampling end to end."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import TINY
from stats_helpers import assert_matches

from dspark.decoding import generate
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter, NoDrafter, Proposal
from dspark.engine import speculative_generate
from dspark.model import ModelConfig, Transformer
from dspark.sampling import SamplingParams, probabilities
from dspark.scheduler import Scheduler, ThroughputProfile, make_policy

GREEDY = SamplingParams(temperature=0.0)


class OracleDrafter(Drafter):
    """Test double: proposes the target's own greedy continuation, corrupting each token with
    probability `noise` (its own RNG). Long accepted runs put EOS and max-new-tokens inside blocks."""

    name = "oracle"

    def __init__(self, target: Transformer, max_gamma: int, noise: float) -> None:
        super().__init__()
        self.target, self.max_gamma, self.noise = target, max_gamma, noise
        self.rng = torch.Generator().manual_seed(123)

    def reset(self, n_slots):
        self.history = {s: [] for s in range(n_slots)}

    def release(self, slot):
        self.history[slot] = []

    @torch.no_grad()
    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        drafts = []
        for slot, chunk, anchor in zip(
            slots.tolist(), committed_tokens.split(committed_lens.tolist()), anchors
        ):
            self.history[slot] += chunk.tolist()
            seq, block = [*self.history[slot], int(anchor)], []
            for _ in range(gamma):
                ctx = seq[-self.target.config.max_seq_len :]
                token = int(self.target(torch.tensor([ctx])).logits[0, -1].argmax())
                if float(torch.rand(1, generator=self.rng)) < self.noise:
                    token = int(torch.randint(0, self.target.config.vocab_size, (1,), generator=self.rng))
                block.append(token)
                seq.append(token)
            drafts.append(block)
        tokens = torch.tensor(drafts, dtype=torch.long).view(len(drafts), gamma)
        return Proposal(tokens, torch.nn.functional.one_hot(tokens, self.target.config.vocab_size).float())


def copy_initialised(drafter: AutoregressiveDrafter) -> AutoregressiveDrafter:
    """Make a random drafter predict 'repeat the token' (identity layers, embedding-only entry):
    the tiny random target repeats itself a lot, so many drafts get accepted."""
    dim = drafter.target.config.dim
    with torch.no_grad():
        drafter.w_in.weight.zero_()
        drafter.w_in.weight[:, :dim] = torch.eye(dim)
        for layer in drafter.layers:
            layer.attn.wo.weight.zero_()
            layer.ffn.w_down.weight.zero_()
    return drafter


def make_drafter(kind: str, target: Transformer, gamma: int) -> Drafter:
    if kind == "none":
        return NoDrafter(target.config.vocab_size)
    if kind == "oracle":
        return OracleDrafter(target, max(gamma, 1), noise=0.25)
    torch.manual_seed(5)
    if kind == "mtp":
        return AutoregressiveDrafter(target, AutoregressiveDrafterConfig("mtp", 1, ffn_hidden=64))
    drafter = AutoregressiveDrafter(
        target, AutoregressiveDrafterConfig("eagle", max(gamma, 1), ffn_hidden=64)
    )
    return copy_initialised(drafter) if kind == "eagle-copy" else drafter


def prompts(lengths, seed=0, vocab=TINY.vocab_size):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


RAGGED = [3, 17, 1, 9, 45, 60]  # the last two hit the 64-token context inside a block
CASES = [("none", 0), ("mtp", 1), ("mtp", 0)] + [
    (kind, gamma) for kind in ("eagle", "eagle-copy", "oracle") for gamma in (1, 2, 4, 5)
]


@pytest.mark.parametrize("kind, gamma", CASES)
def test_greedy_identity_for_every_drafter(tiny_model, kind, gamma):
    ps = prompts(RAGGED)
    reference = generate(tiny_model, ps, 24, GREEDY)
    result = speculative_generate(tiny_model, make_drafter(kind, tiny_model, gamma), ps, 24, GREEDY, gamma)
    assert result.tokens == reference.tokens
    assert result.stop_reasons == reference.stop_reasons


@pytest.mark.parametrize("kind", ["eagle-copy", "oracle"])
@pytest.mark.parametrize("ell", ["0", "1", "gamma-1", "gamma", "random"])
def test_verify_lengths_0_1_gamma_minus_1_gamma(tiny_model, kind, ell):
    gamma = 4
    fixed = {"0": 0, "1": 1, "gamma-1": gamma - 1, "gamma": gamma}
    g = torch.Generator().manual_seed(9)

    class Lengths(Scheduler):
        def __call__(self, proposal):
            R = proposal.tokens.shape[0]
            if ell == "random":  # a different length per request and per round
                return torch.randint(0, gamma + 1, (R,), generator=g)
            return torch.full((R,), fixed[ell], dtype=torch.long)

    ps = prompts(RAGGED, seed=1)
    reference = generate(tiny_model, ps, 20, GREEDY).tokens
    result = speculative_generate(tiny_model, make_drafter(kind, tiny_model, gamma), ps, 20, GREEDY, gamma,
                                  scheduler=Lengths(make_policy("fixed"), ThroughputProfile([1.0])))  # fmt: skip
    assert result.tokens == reference
    assert all(v <= gamma for lens in result.stats.verify_lens for v in lens)
    if ell == "0":
        assert result.stats.tau == 1.0 and not any(itertools.chain(*result.from_draft))


def test_oracle_gets_long_accepted_runs(tiny_model):
    result = speculative_generate(
        tiny_model, make_drafter("oracle", tiny_model, 5), prompts([4, 9]), 30, GREEDY, 5
    )
    assert result.stats.tau > 2.0  # the loop really accepts multi-token blocks
    rates = result.stats.acceptance_by_position(5)
    assert all(r is not None and 0 < r <= 1 for r in rates)


def test_eos_inside_a_block(tiny_model):
    ps = prompts([5, 11, 2], seed=4)
    free = generate(tiny_model, ps, 30, GREEDY).tokens
    eos = free[1][6]  # some token the second request emits mid-stream
    reference = generate(tiny_model, ps, 30, GREEDY, eos_id=eos)
    drafter = OracleDrafter(tiny_model, 6, noise=0.0)  # every block fully accepted
    result = speculative_generate(tiny_model, drafter, ps, 30, GREEDY, 6, eos_id=eos)
    assert result.tokens == reference.tokens and result.stop_reasons == reference.stop_reasons
    first = free[1].index(eos)
    assert first % 7 != 6  # EOS really fell inside a block of 7 emitted tokens, not at its end


@pytest.mark.parametrize("max_new", [1, 2, 9, 10, 13])
def test_max_new_tokens_boundary_inside_a_block(tiny_model, max_new):
    ps = prompts([6, 3], seed=5)
    reference = generate(tiny_model, ps, max_new, GREEDY).tokens
    result = speculative_generate(tiny_model, OracleDrafter(tiny_model, 4, noise=0.0), ps, max_new, GREEDY, 4)
    assert result.tokens == reference
    assert [len(t) for t in result.tokens] == [max_new, max_new]
    # τ counts committed tokens only: rounds' tokens + each prompt's first (prefill) token = all output
    stats = result.stats
    assert stats.tau * stats.rounds + len(ps) == pytest.approx(sum(len(t) for t in result.tokens))


def test_tau_counts_only_tokens_before_eos(tiny_model):
    ps = prompts([5, 11, 2], seed=4)
    eos = generate(tiny_model, ps, 30, GREEDY).tokens[1][6]
    result = speculative_generate(
        tiny_model, OracleDrafter(tiny_model, 6, noise=0.0), ps, 30, GREEDY, 6, eos_id=eos
    )
    stats = result.stats
    cut = sum(a + 1 for acc in stats.accepted for a in acc) - sum(map(sum, stats.emitted))
    assert cut > 0  # some accepted tokens lay past EOS/the limit in a last round (the case under test)
    assert stats.tau * stats.rounds + len(ps) == pytest.approx(sum(len(t) for t in result.tokens))


def test_gamma_beyond_the_drafter_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="gamma"):
        speculative_generate(tiny_model, make_drafter("mtp", tiny_model, 1), prompts([3]), 5, GREEDY, 2)


# ---- exact sampling, end to end ------------------------------------------------------------
MICRO = ModelConfig(vocab_size=5, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=24, max_seq_len=16,
                    tap_layers=(0, 1))  # fmt: skip


MICRO_PROMPT, MICRO_LENGTH = [1, 3, 0], 3  # the exactness checks decode 3 tokens after this prompt


def micro_target_and_law() -> tuple[Transformer, torch.Tensor]:
    """The vocab-5 target of the exactness checks (sharpened a little so drafters are
    sometimes right) and the exact law of its 3 tokens after MICRO_PROMPT at T = 1."""
    torch.manual_seed(0)
    target = Transformer(MICRO).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    return target, exact_joint(target, MICRO_PROMPT, SamplingParams(temperature=1.0), MICRO_LENGTH)


def exact_joint(model: Transformer, prompt: list[int], params: SamplingParams, length: int) -> torch.Tensor:
    """P(x1..x_length | prompt) for every sequence, by enumerating all prefixes."""
    V = model.config.vocab_size
    joint = torch.zeros([V] * length, dtype=torch.float64)
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=length):
            p = 1.0
            for k in range(length):
                logits = model(torch.tensor([prompt + list(seq[:k])])).logits[0, -1]
                p *= float(probabilities(logits, params)[seq[k]])
            joint[seq] = p
    return joint


@pytest.mark.parametrize("kind, gamma", [("eagle", 3), ("mtp", 1), ("eagle-copy", 2)])
def test_sampled_output_follows_the_target_exactly(kind, gamma):
    target, joint = micro_target_and_law()
    params, prompt, length = SamplingParams(temperature=1.0), MICRO_PROMPT, MICRO_LENGTH
    drafter = make_drafter(kind, target, gamma)
    g = torch.Generator().manual_seed(42)
    counts = torch.zeros(MICRO.vocab_size**length)
    accepted_any = 0
    for _ in range(12):
        result = speculative_generate(target, drafter, [prompt] * 1000, length, params, gamma, generator=g)
        for toks in result.tokens:
            counts[toks[0] * 25 + toks[1] * 5 + toks[2]] += 1
        accepted_any += sum(itertools.chain(*result.from_draft))
    assert accepted_any > 500  # drafts were really accepted, so the test exercises verification
    assert_matches(counts, joint.flatten())


@pytest.mark.parametrize(
    "name, gamma", [("mtp", 1), ("eagle", 7), ("eagle", 3), ("dflash", 7), ("dspark", 7), ("dspark", 2)]
)
def test_shipped_drafters_are_greedy_identical(name, gamma, tokenizer):
    from dspark.checkpoint import TARGET_CHECKPOINT, load_target
    from dspark.drafters import default_path, get_drafter
    from dspark.lab.data.corpus import EVAL_PROMPTS_PATH, load_eval_prompts

    if not (TARGET_CHECKPOINT.is_file() and default_path(name).is_file()):
        pytest.skip(f"no shipped {name} drafter")
    target, _ = load_target(TARGET_CHECKPOINT)
    records = load_eval_prompts(EVAL_PROMPTS_PATH)
    ps = [tokenizer.chat_prompt(r["prompt"]) for r in records[::80]]  # one prompt per domain, ragged lengths
    reference = generate(target, ps, 40, GREEDY, eos_id=tokenizer.eos_id)
    result = speculative_generate(
        target, get_drafter(name, target), ps, 40, GREEDY, gamma, eos_id=tokenizer.eos_id
    )
    assert result.tokens == reference.tokens
    assert result.stats.tau > 1.2  # a trained drafter really gets tokens accepted
