"""How fast drafters train: anchors (blocks) and supervised positions per second, per setting.

`python -m dspark.bench training` times a few optimizer steps of a drafter on
the same batches under each setting it is asked for:

  * features: `live` (a target pass every step, as before the feature cache)
    or `cache` (read from the feature cache; p_t only at supervised positions);
  * anchors per sequence: 16, 32, 64 or 0 = every response position;
  * precision: fp32, or bf16 autocast of the drafter's forward.

Per setting: seconds per step, anchors (= blocks) per second, supervised
(anchor, draft position) pairs per second. Wall-clock, so it moves with the
machine's load; the benchmark prints it, no test asserts it.

What this file does not do: train to convergence (dspark/lab/training/drafters.py).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from dspark.lab.study.offline import wait
from dspark.lab.training.drafters import DrafterTrainConfig, FeatureSource, batch_loss
from dspark.model import Transformer


def time_training_steps(
    drafter: torch.nn.Module,
    target: Transformer,
    source: FeatureSource,
    tc: DrafterTrainConfig,
    steps: int,
    warmup: int = 1,
) -> dict:
    """Median seconds per optimizer step over `steps` timed steps (after `warmup`), with the anchors
    and supervised pairs per second they processed. Batches are the first sequences of `source` in a
    fixed order, so every setting sees the same data."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr)
    g = torch.Generator().manual_seed(tc.seed)
    drafter.train()
    times, anchors, pairs = [], 0, 0
    for step in range(warmup + steps):
        start = (step * tc.batch_size) % max(1, len(source) - tc.batch_size)
        t0 = time.perf_counter()
        batch = source.batch(list(range(start, start + tc.batch_size)))
        loss, _, n_anchors, n_pairs = batch_loss(drafter, target, batch, tc, g)
        if loss is not None:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        wait(batch.tokens.device)  # on CUDA the clock measures the step, not its queueing
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            anchors, pairs = anchors + n_anchors, pairs + n_pairs
    total = sum(times)
    return {"seconds_per_step": statistics.median(times), "anchors_per_s": anchors / total,
            "supervised_per_s": pairs / total, "anchors_per_step": anchors / steps}  # fmt: skip


def training_speed_table(
    make_drafter,
    target: Transformer,
    sources: dict[str, FeatureSource],
    settings: list[dict],
    tc: DrafterTrainConfig,
    steps: int,
) -> list[dict]:
    """One row per setting {"features": "live"|"cache", "anchors": int, "bf16": bool}; `make_drafter()`
    gives a freshly initialised drafter (the same seed for every setting)."""
    rows = []
    for setting in settings:
        run = replace(tc, anchors_per_seq=setting["anchors"], bf16=setting["bf16"])
        measured = time_training_steps(make_drafter(), target, sources[setting["features"]], run, steps)
        rows.append({**setting, **measured})
    return rows
