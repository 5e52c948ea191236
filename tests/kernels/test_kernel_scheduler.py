"""The device prefix scheduler (dspark_kernels/prefix_scheduler.py) against its reference,
prefix_schedule(prefix_survival(...)), and the scheduler's dispatch that picks between them.

The kernel runs here under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1);
its sort is slow there (~0.5 s for a 64 x 8 tile), so the big sizes get one mode per case."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from dspark.drafters.base import Proposal  # noqa: E402
from dspark.scheduler import (  # noqa: E402
    PrefixPolicy,
    Scheduler,
    ThresholdPolicy,
    ThroughputProfile,
    prefix_schedule,
    prefix_survival,
)
from dspark_kernels import kernels_as
from dspark_kernels.prefix_scheduler import MAX_TILE, fits, prefix_schedule_triton  # noqa: E402

# a cost per token plus a step every 4 tokens (CUDA-graph-like buckets): Θ along the path is jagged,
# so the early stop and the retrospective argmax disagree; 128 entries, so R = 37, γ = 7 runs past them
JAGGED = ThroughputProfile([1 / (0.3 + 0.003 * B + 0.005 * ((B + 3) // 4)) for B in range(1, 129)], "jagged")
SMOOTH = ThroughputProfile([1 / (0.3 + 0.02 * B) for B in range(1, 65)], "smooth")  # strictly decreasing
MODES = {"early": dict(early_stop=True), "retro": dict(early_stop=False)}


def both(conf, temps, profile, **mode) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel, reference) verify lengths for one batch."""
    kernel = prefix_schedule_triton(conf, temps, profile.table(), **mode)
    reference = prefix_schedule(prefix_survival(conf, temps), profile, **mode)
    return kernel, reference


def temperatures(gamma: int, g: torch.Generator, offsets: bool = False) -> torch.Tensor:
    """(γ',) STS temperatures, or (2, γ') temperatures and logit offsets; γ' > γ: only the first γ are used."""
    temps = 0.5 + 1.5 * torch.rand(gamma + 2, generator=g)
    return torch.stack([temps, torch.rand(gamma + 2, generator=g) - 0.5]) if offsets else temps


@pytest.mark.parametrize("seed", range(3))
def test_kernel_equals_reference_on_random_batches(seed):
    g = torch.Generator().manual_seed(seed)
    jagged_differs = 0
    for i, (R, gamma) in enumerate(itertools.product((1, 3, 37), (1, 5, 7))):
        conf = torch.rand(R, gamma, generator=g) ** 0.3  # mostly confident, some low
        kind = (i // 3 + seed) % 3  # none, temperatures, with offsets: each R gets all three over the seeds
        temps = None if kind == 0 else temperatures(gamma, g, offsets=kind == 2)
        profile = JAGGED if (i + seed) % 3 else SMOOTH
        budget = int(torch.randint(0, R * gamma + 4, (1,), generator=g))  # 0 ..= R·γ + 3
        for mode in (MODES["early"], MODES["retro"], dict(budget=budget)):
            kernel, reference = both(conf, temps, profile, **mode)
            assert kernel.dtype == torch.long and kernel.shape == (R,)
            assert torch.equal(kernel, reference), (R, gamma, temps is not None, profile.name, mode)
        if profile is JAGGED:
            survivals = prefix_survival(conf, temps)
            early = prefix_schedule(survivals, profile, early_stop=True)
            jagged_differs += not torch.equal(early, prefix_schedule(survivals, profile, early_stop=False))
    assert jagged_differs >= 1  # the two modes were really told apart somewhere


def test_budgets_from_nothing_to_more_than_everything():
    g = torch.Generator().manual_seed(7)
    conf = torch.rand(3, 5, generator=g)
    for budget in (-2, 0, 1, 8, 15, 16, 10**6):
        kernel, reference = both(conf, None, SMOOTH, budget=budget)
        assert torch.equal(kernel, reference) and int(kernel.sum()) == max(0, min(budget, 15))


# temperatures up to 8 pull even a confidence of exactly 1 visibly below 1 (σ(logit(1 - 1e-12) / 8) ≈ 0.97)
WIDE_TEMPS = torch.tensor([0.7, 1.0, 8.0, 2.0, 5.0, 1.3])


PATTERNS = ["identical-rows", "zeros", "ones", "near-ones", "sure-prefix", "staggered"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_exact_ties_follow_the_reference_order(pattern):
    g = torch.Generator().manual_seed(3)
    R, gamma = 5, 5
    conf = {
        "identical-rows": torch.rand(1, gamma, generator=g).expand(R, gamma).contiguous(),
        "zeros": torch.zeros(R, gamma),
        "ones": torch.ones(R, gamma),
        # with WIDE_TEMPS a sure draft at position 2 (≈ 0.97) ranks below a 0.995 at position 0 (≈ 0.9995)
        "near-ones": torch.cat([torch.ones(R - 1, gamma), torch.full((1, gamma), 0.995)]),
        # confidences of exactly 1 repeat a survival inside a row; rows 0, 2 and 3 tie everywhere
        "sure-prefix": torch.tensor([[0.9, 1, 1, 0.5, 1], [1, 1, 0.2, 1, 1]] * 3)[[0, 1, 0, 0, 1]],
        # 0.9 sits at a different position in every row: ties across rows AND positions
        "staggered": torch.ones(R, gamma) - 0.1 * torch.eye(R, gamma),
    }[pattern]
    budgets = range(R * gamma + 1) if pattern == "staggered" else (7, 9, R * gamma)
    # with STS, exact ties of "staggered" become float64 near-ties that fp32 cannot see
    for temps in (None,) if pattern == "staggered" else (None, WIDE_TEMPS):
        for profile in (SMOOTH, JAGGED):
            for mode in (MODES["early"], MODES["retro"]):
                kernel, reference = both(conf, temps, profile, **mode)
                assert torch.equal(kernel, reference), (pattern, temps is not None, profile.name, mode)
        for budget in budgets:
            kernel, reference = both(conf, temps, SMOOTH, budget=budget)
            assert torch.equal(kernel, reference), (pattern, temps is not None, budget)
    if pattern == "zeros":
        assert prefix_schedule_triton(conf, None, SMOOTH.table()).tolist() == [0] * R


def test_equal_rates_are_not_improvements():
    # sure drafts then hopeless ones on a flat table: Θ stays exactly level after the last 1
    flat = ThroughputProfile([1.0] * 16)
    sure_then_zero = torch.tensor([[1.0, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    for conf in (sure_then_zero, torch.zeros(3, 5)):
        for mode in (MODES["early"], MODES["retro"]):
            kernel, reference = both(conf, None, flat, **mode)
            assert torch.equal(kernel, reference), (conf, mode)
            assert kernel.tolist() == (conf == 1).sum(dim=1).tolist()  # the ones, not a single zero


def test_batches_beyond_the_sps_table():
    conf = torch.tensor([[0.99, 0.9, 0.8], [0.95, 0.5, 0.1], [0.7, 0.7, 0.7]])
    tiny = ThroughputProfile([1.0, 0.97])  # M = 2 < R: even SPS(R) is extrapolated
    for profile, rows in itertools.product((tiny, ThroughputProfile([1.0] * 4)), (1, 3)):
        for mode in (MODES["early"], MODES["retro"], dict(budget=4)):
            kernel, reference = both(conf[:rows].contiguous(), None, profile, **mode)
            assert torch.equal(kernel, reference), (profile.steps_per_second, rows, mode)


def test_empty_batches_need_no_launch():
    table = SMOOTH.table()
    assert prefix_schedule_triton(torch.zeros(0, 4), None, table).shape == (0,)
    lengths = prefix_schedule_triton(torch.zeros(3, 0), torch.ones(2), table, budget=5)
    assert lengths.tolist() == [0, 0, 0] and lengths.dtype == torch.long


def test_wrapper_rejects_bad_inputs():
    conf, table = torch.rand(4, 3), SMOOTH.table()
    bad = [
        (conf.double(), None, table, "float32"),
        (torch.rand(3, 4).t(), None, table, "contiguous"),
        (conf[0], None, table, r"\(R, γ\)"),
        (conf, torch.ones(2), table, "γ' >= γ"),
        (conf, torch.ones(3, 3), table, r"\(2, γ'\)"),
        (conf, torch.ones(2, 2), table, "γ' >= γ"),
        (conf, torch.ones(3, dtype=torch.float64), table, "float32"),
        (conf, None, table.double(), "float32"),
        (conf, None, torch.ones(0), "non-empty"),
        (conf, None, torch.ones(5, device="meta"), "meta"),
        (torch.rand(65, 33), None, table, str(MAX_TILE)),  # 128 · 64 > 4096
    ]
    for c, t, s, message in bad:
        with pytest.raises(ValueError, match=message):
            prefix_schedule_triton(c, t, s)
    assert fits(64, 64) and not fits(65, 33)


def test_the_scheduler_dispatches_algorithm_1_to_the_kernel_and_back():
    g = torch.Generator().manual_seed(5)
    conf, sts = torch.rand(6, 5, generator=g), temperatures(5, g, True).double()  # float64

    def lengths(conf, policy=None, sts=sts, profile=JAGGED):
        proposal = Proposal(torch.zeros(conf.shape, dtype=torch.long), torch.zeros(*conf.shape, 3), conf)
        return Scheduler(policy or PrefixPolicy(), profile, sts)(proposal)

    with kernels_as("reference"):
        expected = lengths(conf)
    survivals = prefix_survival(conf, sts)
    assert torch.equal(expected, prefix_schedule(survivals, JAGGED))
    with kernels_as("triton"):
        assert torch.equal(lengths(conf), expected)
        big = torch.rand(65, 33, generator=g)  # too big for one tile: the reference answers
        assert torch.equal(
            lengths(big, sts=None, profile=SMOOTH), prefix_schedule(prefix_survival(big), SMOOTH)
        )
        # a policy other than Algorithm 1 never goes to the kernel
        threshold = ThresholdPolicy(0.3)
        assert torch.equal(lengths(conf, threshold), threshold.lengths(survivals, JAGGED))
    assert SMOOTH.table() is SMOOTH.table(torch.device("cpu")) and SMOOTH.table().dtype == torch.float32
