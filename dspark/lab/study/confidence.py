"""The trained confidence head + STS against the free online confidence, on the same rounds.

Three confidences for one drafter's fully verified rounds:

  * `head`: DSpark's trained confidence head;
  * `online`: the drafter's own top probability (dspark/lab/online_confidence.py);
  * `oracle`: 1 up to the drafts the round accepts, 0 after: what no drafter knows, the ceiling.

`head` and `online` go through the same `select_sts` (the same `fit_sts` grid, the same held-out checks),
fitted on the rounds of other prompts (the fit set), then scored on the held-out rounds per position: ECE of
the calibrated prefix survival and AUROC (does a round that survives to k score higher than one that does
not). Then what Algorithm 1 makes of each: the held-out rounds replayed through the `dspark` policy on an SPS
profile (simulator.py: a round that verifies ℓ drafts accepts min(ℓ, a)), throughput and mean verify length per
concurrency, beside verifying every draft (`fixed`). The same seed draws the same requests for every
confidence, so the comparison is paired.
"""

from __future__ import annotations

import torch

from dspark.calibration import auroc
from dspark.lab.calibration import position_metrics, select_sts
from dspark.lab.online_confidence import OnlineConfidence
from dspark.lab.study import offline
from dspark.lab.study.simulator import simulate, traces_from_records
from dspark.requests import RoundStats
from dspark.scheduler import ThroughputProfile, make_policy, prefix_survival

CONFIDENCES = ("head", "online")


def record_both(target, drafter, tokenizer, per_domain: int, start: int, params, gamma: int, max_new_tokens: int,
                prompts_file=None) -> dict[str, RoundStats]:  # fmt: skip
    """Fully verified rounds of `drafter` on eval prompts start .. start+per_domain-1, recorded twice: with its
    head's confidences and with the online ones. Full verification never reads a confidence, so both runs
    decode the same rounds (checked)."""
    rounds = {name: offline.record_rounds(target, d, tokenizer, per_domain, params, gamma, max_new_tokens, start,
                                          prompts_file=prompts_file)
              for name, d in (("head", drafter), ("online", OnlineConfidence(drafter)))}  # fmt: skip
    if rounds["head"].accepted != rounds["online"].accepted:
        raise RuntimeError("the two recordings decoded different rounds: decoding is not deterministic here")
    return rounds


def oracle(rounds: RoundStats) -> RoundStats:
    """The same rounds with confidence 1 on the drafts each accepts and 0 after them."""
    confs = [[[1.0] * r.accepted + [0.0] * (len(r.confidences) - r.accepted) if r.confidences else []
              for r in request] for request in rounds.requests]  # fmt: skip
    return RoundStats.from_lists(rounds.verify_lens, rounds.accepted, confs, rounds.emitted)


def mean_auroc(survivals: torch.Tensor, events: torch.Tensor) -> float:
    """AUROC of the (N, γ) survivals against the events, averaged over positions where it is defined."""
    values = [auroc(survivals[:, k], events[:, k]) for k in range(events.shape[1])]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def auroc_difference_interval(
    head: torch.Tensor, online: torch.Tensor, events: torch.Tensor, draws: int = 200, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval of mean AUROC(head) - mean AUROC(online), rounds resampled (paired)."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, events.shape[0], (draws, events.shape[0]), generator=g)
    diffs = sorted(mean_auroc(head[p], events[p]) - mean_auroc(online[p], events[p]) for p in picks)
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


def replay(rounds: RoundStats, sts, policy: str, profile: ThroughputProfile, concurrency: int, gamma: int,
           requests: int, seeds: int) -> dict:  # fmt: skip
    """Throughput and mean verify length of `policy` over the rounds, averaged over `seeds` request draws."""
    traces = traces_from_records(rounds.verify_lens, rounds.accepted, rounds.confidences, gamma)
    runs = [simulate(traces, make_policy(policy), profile, concurrency, gamma, requests, sts, seed=s)
            for s in range(seeds)]  # fmt: skip
    return {key: sum(r[key] for r in runs) / seeds for key in ("throughput", "mean_verify_len", "tau")}


def compare(fit: dict[str, RoundStats], held: dict[str, RoundStats], profile: ThroughputProfile,
            concurrencies: list[int], requests: int, gamma: int, seeds: int = 3) -> dict:  # fmt: skip
    """Calibrate `head` and `online` on `fit`, score them on `held`; replay `held` through Algorithm 1."""
    out: dict = {"confidences": {}}
    survivals, fitted = {}, {}
    for name in CONFIDENCES:
        fitted[name], reasons = select_sts(*fit[name].calibration_arrays())
        conf, events, mask = held[name].calibration_arrays()  # the same events and mask for both
        survivals[name] = prefix_survival(conf, fitted[name])
        out["confidences"][name] = {"sts": fitted[name].tolist(), "reasons": reasons,
                                    "positions": position_metrics(conf, events, mask, fitted[name]),
                                    "mean_auroc": mean_auroc(survivals[name], events)}  # fmt: skip
    out["auroc_difference_95"] = auroc_difference_interval(survivals["head"], survivals["online"], events)
    runs = [("fixed", held["head"], None, "fixed"), ("head", held["head"], fitted["head"], "dspark"),
            ("online", held["online"], fitted["online"], "dspark"), ("oracle", oracle(held["head"]), None, "dspark")]  # fmt: skip
    out["serve"] = [{"confidence": name, "concurrency": c,
                     **replay(rounds, sts, policy, profile, c, gamma, requests, seeds)}
                    for name, rounds, sts, policy in runs for c in concurrencies]  # fmt: skip
    return out
