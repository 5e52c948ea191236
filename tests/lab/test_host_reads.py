"""dspark/lab/host_reads.py: the device-to-host reads of the engine's hot paths, counted from outside the core
per engine step and in prefill, by the function that read; the counter sees every kind of read and is removed
on exit."""

from __future__ import annotations

import torch
from helpers import make, prompts

from dspark.engine import Engine, Request
from dspark.lab.host_reads import HostReads
from dspark.sampling import SamplingParams
from dspark.scheduler import Scheduler, ThroughputProfile, make_policy

PROFILE = ThroughputProfile([1 / (1.0 + 0.05 * B) for B in range(1, 257)])
TEMPERATURES = torch.tensor([1.1, 0.9, 1.0, 0.5], dtype=torch.float64)


def test_the_counter_sees_every_kind_of_read_and_goes_away():
    x = torch.arange(4)
    with HostReads() as reads:
        x.tolist(), x[0].item(), int(x[1]), float(x[2]), bool(x[3] > 0)
    assert reads.total == 5 and list(reads.by_function) == [
        f"{__name__}.{test_the_counter_sees_every_kind_of_read_and_goes_away.__name__}"
    ]
    x.tolist()  # no longer counted
    assert reads.total == 5 and torch.Tensor.tolist is torch._C.TensorBase.tolist


def test_host_reads_per_engine_step(tiny_model):
    drafter = make(tiny_model, "dspark", gamma=4)
    scheduler = Scheduler.for_drafter(make_policy("dspark"), drafter, PROFILE, TEMPERATURES)
    engine = Engine(tiny_model, drafter, SamplingParams(1.0), 4, 3, None, scheduler)
    requests = [Request(p, 12) for p in prompts([4, 9, 3], seed=8)]
    with HostReads(engine) as reads:
        result = engine.run(requests)
    assert result.steps > 0 and len(reads.per_step) == result.steps
    # every step (README, "On a GPU"): the drafter's ragged index, Algorithm 1's walk (the reference), the
    # verify lengths, the target pass's ragged index, the outcome
    assert reads.per_step == [5] * result.steps, reads.by_function
    assert reads.total == sum(reads.per_step) + reads.prefill and reads.prefill > 0
    assert "step" not in vars(engine)  # the engine's own methods again
