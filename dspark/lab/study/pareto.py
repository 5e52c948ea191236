"""The throughput vs tokens/s-per-user benchmark against MTP-1 (paper section 5, Figs. 7-8).

Two ways, the same `points` format
`{policy, drafter, concurrency, throughput, tps_per_user, tpot_ms, mean_verify_len, tau}`
(`serve_points` adds `ttft_ms`, `completed` and `rejected` request counts):

  * throughput: output tokens of all requests / wall time of the run;
  * tps_per_user: the *decode* speed a user sees once the reply has started,
    the mean over requests of 1 / TPOT with TPOT = (E2E − TTFT) / (n − 1):
    queueing, prefill and the first token are excluded (they are TTFT), so at
    C = 1 it can exceed the throughput, which includes them; this is the
    per-user axis of the paper's frontier;
  * tau: committed tokens per request-round (`RoundStats.tau`).


  * `serve_points`: the real engine (dspark/engine.py) on this CPU, closed loop
    at each concurrency C over held-out prompts, with the measured CPU SPS
    profile feeding the schedulers;
  * `simulate_points`: the trace-driven simulator (dspark/lab/study/simulator.py) on a
    modelled GPU profile, replaying rounds recorded from the real drafters.

Which drafter a policy uses: `none` drafts nothing, `mtp1` uses the MTP-1
drafter (γ = 1), every other policy the DSpark drafter (γ = 7). Plots: one
frontier per policy (throughput against tokens/s per user, one point per C),
and throughput / mean verify length against C. What this file does not do:
parse arguments (`python -m dspark.bench serve|simulate`).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.device import model_device
from dspark.drafters.base import Drafter, NoDrafter
from dspark.engine import Request, Run
from dspark.lab import storage
from dspark.lab.calibration import get_calibration
from dspark.lab.cost_aware.draft_cost import DraftCost, roofline_draft_cost
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.scheduler import COST_AWARE, CostAwareScheduler
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.profiles import RooflineConfig
from dspark.lab.step_cost import engine_draft_cost
from dspark.lab.study import offline, tables
from dspark.lab.study.simulator import RequestTrace, simulate, traces_from_records
from dspark.lab.study.stats import mean_interval
from dspark.lab.training.feature_cache import weights_fingerprint
from dspark.model import Transformer
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams
from dspark.scheduler import ThroughputProfile, make_policy
from dspark.tokenizer import Tokenizer


def drafter_for(policy: str) -> tuple[str, int]:
    """(drafter name, γ) a policy runs with."""
    if policy == "none":
        return "none", 0
    if policy == "mtp1":
        return "mtp", 1
    return "dspark", 7


def serve_points(
    target: Transformer,
    tokenizer: Tokenizer,
    policies: list[str],
    concurrencies: list[int],
    requests: int,
    max_new_tokens: int,
    profile: ThroughputProfile,
    params: SamplingParams,
    seed: int = 0,
    arrival_rate: float | None = None,
    cost_aware: bool = True,
    target_name: str = "tiny",
    repeats: int = 1,
    prompts_file: str | None = None,
    draft_costs: dict[str, DraftCost] | None = None,
) -> list[dict]:
    """Measured points of the real engine on this machine: closed loop, or with
    `arrival_rate` requests/s arriving as a Poisson process (C then caps the active ones).
    The cost-aware policies weigh the drafter's measured drafting time (CPU, cached) unless
    `cost_aware` is False (the ablation). The drafters are those shipped for `target_name`.
    With `repeats` > 1 the whole sweep runs that many times and the points are combined
    (`combine_repeats`). `prompts_file`: the requests come from that file's held-out prompts (40 per
    domain at most) instead of the shipped ones. `draft_costs` (by drafter name) replace the measured ones."""
    pool = [
        p
        for ps in offline.prompts_by_domain(
            tokenizer, 40, 0, target.config.max_seq_len, prompts_file
        ).values()
        for p in ps
    ]
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = [pool[order[i % len(pool)]] for i in range(requests)]
    arrivals = [0.0] * requests
    if arrival_rate:
        gaps = torch.empty(requests).exponential_(arrival_rate, generator=torch.Generator().manual_seed(seed))
        arrivals = torch.cumsum(gaps, 0).tolist()
    drafters: dict[str, Drafter] = {}
    setups = {}  # policy -> (drafter name, γ, drafting cost, STS temperatures)
    for policy_name in policies:
        name, gamma = drafter_for(policy_name)
        if name not in drafters:
            drafters[name] = (
                NoDrafter(target.config.vocab_size)
                if name == "none"
                else get_drafter(name, target, target_name=target_name)
            )
        cost = None  # measured once per policy (cached), before any engine resets the drafter
        if cost_aware and policy_name in COST_AWARE:
            if draft_costs is not None:
                cost = draft_costs[name]
            elif model_device(target).type == "cpu":
                cost = engine_draft_cost(target, drafters[name], gamma)
        setups[policy_name] = (name, gamma, cost, get_calibration(name, target_name=target_name))
    points = []
    bar = tqdm(total=repeats * len(policies) * len(concurrencies) * requests, desc="serve", unit="req")
    # the policies side by side at each C (and the sweep repeated): a drift of the machine's speed hits them alike
    for repeat, C in ((r, C) for r in range(repeats) for C in concurrencies):
        for policy_name in policies:
            name, gamma, cost, temperatures = setups[policy_name]
            drafter = drafters[name]
            scheduler = CostAwareScheduler.for_drafter(
                make_policy(policy_name), drafter, profile, temperatures, cost
            )
            engine = CostAwareEngine(target, drafter, params, gamma, C, tokenizer.eos_id, scheduler)
            engine.run([Request(prompts[0], 4)] * min(C, 2))  # warm-up
            result = engine.run([Request(p, max_new_tokens, a) for p, a in zip(prompts, arrivals)],
                                torch.Generator().manual_seed(seed), bar.update)  # fmt: skip
            points.append({"policy": policy_name, "drafter": name, "concurrency": C, "repeat": repeat,
                           **serve_metrics(result)})  # fmt: skip
    bar.close()
    points = combine_repeats(points) if repeats > 1 else points
    return sorted(points, key=lambda p: (policies.index(p["policy"]), p["concurrency"]))  # policy by policy


PAIRED = (
    ("vs_plain", "none", "throughput"),
    ("per_user_vs_mtp1", "mtp1", "tps_per_user"),
)  # (name, base, metric)


def combine_repeats(points: list[dict]) -> list[dict]:
    """One point per (policy, C) from repeated sweeps: the median of every measured number, the number of
    repeats, and -- paired within a repeat and C, so that the machine's drift between repeats cancels --
    the mean ratio and its 95% interval of the throughput to plain decoding's (`vs_plain`) and of the
    per-user speed to MTP-1's (`per_user_vs_mtp1`), where those policies ran."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for p in points:
        runs.setdefault((p["policy"], p["concurrency"]), []).append(p)
    out = []
    for (policy, C), mine in runs.items():
        point = {"policy": policy, "drafter": mine[0]["drafter"], "concurrency": C, "repeats": len(mine)}
        for key, value in mine[0].items():
            if key not in point and key != "repeat" and isinstance(value, (int, float)):
                point[key] = statistics.median(r[key] for r in mine)
        for name, base, metric in PAIRED:
            if policy != base and (base, C) in runs:
                of_base = {r["repeat"]: r[metric] for r in runs[(base, C)]}
                ratios = [r[metric] / of_base[r["repeat"]] for r in mine if of_base.get(r["repeat"])]
                if ratios:
                    mean, low, high = mean_interval(ratios)
                    point[name] = {"mean": mean, "low": low, "high": high, "ratios": ratios}
        out.append(point)
    return out


def serve_metrics(result: Run) -> dict:
    """The numbers of one `bench serve` point, from the engine's per-request records (module docstring)."""
    served = [r for r in result.records if not r.error]
    tpots = [r.tpot for r in served if r.tpot]
    stats = result.stats
    return {
        "throughput": result.tokens_per_s,
        "tps_per_user": statistics.mean(1 / t for t in tpots) if tpots else float("nan"),
        "tpot_ms": 1000 * statistics.mean(tpots) if tpots else float("nan"),
        "ttft_ms": 1000 * statistics.mean(r.ttft for r in served) if served else float("nan"),
        "mean_verify_len": stats.mean_verify_len,
        "tau": stats.tau,
        "draft_share": result.draft_seconds / result.seconds if result.seconds else 0.0,
        "drafting_rounds": result.drafted_rounds
        / max(1, stats.rounds),  # share of request-rounds that drafted
        "completed": len(served),
        "rejected": len(result.records) - len(served),
    }


def trace_path(drafter: str, temperature: float, target_name: str = "tiny") -> Path:
    return storage.target_home(target_name) / "traces" / f"{drafter}_T{temperature:g}.json"


def trace_record(record: dict) -> dict:
    """A cached trace record, checked to hold the rounds `traces_from_records` reads."""
    for field in ("verify_lens", "accepted", "confidences"):
        if not isinstance(record[field], list):
            raise TypeError(f"{field} is not a list")
    return record


def record_traces(
    target: Transformer, tokenizer: Tokenizer, drafter_name: str, gamma: int, params: SamplingParams,
    per_domain: int = 16, max_new_tokens: int = 128, refresh: bool = False, target_name: str = "tiny",
) -> tuple[list[RequestTrace], torch.Tensor | None]:  # fmt: skip
    """Fully verified rounds of a real drafter (shipped for `target_name`) on held-out prompts (cached under
    DSPARK_HOME, per target), and its STS temperatures. The cache holds what it was recorded with -- the
    target's and the drafter's weights, γ, the prompts, the length -- and is recorded again when any differs
    (a retrained drafter never replays its predecessor's rounds)."""
    drafter = get_drafter(drafter_name, target, target_name=target_name)
    path = trace_path(drafter_name, params.temperature, target_name)
    key = {"weights": weights_fingerprint(target, drafter), "gamma": gamma, "per_domain": per_domain,
           "max_new_tokens": max_new_tokens}  # fmt: skip
    hint = "python -m dspark.bench simulate --refresh"
    record = None if refresh else storage.read_cache(path, key, trace_record, hint)
    if record is None:
        rounds = RoundStats()
        for ps in offline.prompts_by_domain(tokenizer, per_domain, 0, target.config.max_seq_len).values():
            rounds.extend(
                offline.measure_tau(target, drafter, ps, params, gamma, max_new_tokens, tokenizer.eos_id)
            )
        record = {"key": key, "gamma": gamma, "verify_lens": rounds.verify_lens, "accepted": rounds.accepted,
                  "confidences": rounds.confidences}  # fmt: skip
        storage.write_cache(path, record)
    traces = traces_from_records(record["verify_lens"], record["accepted"], record["confidences"], gamma)
    return traces, get_calibration(drafter_name, target_name=target_name)


def simulate_points(
    traces: dict[str, tuple[list[RequestTrace], torch.Tensor | None]],
    policies: list[str],
    concurrencies: list[int],
    requests: int,
    profile: ThroughputProfile,
    draft_costs: dict[str, DraftCost] | None = None,
    cost_aware: bool = True,
) -> list[dict]:
    """Simulated points; `traces` maps a drafter name to its traces and STS temperatures, `draft_costs`
    a drafter name to what its drafting pass costs (default: free; see `gpu_draft_costs`)."""
    points = []
    for policy_name in policies:
        name, gamma = drafter_for(policy_name)
        source, temps = traces["dspark" if name == "none" else name]
        cost = (draft_costs or {}).get(name)
        for C in concurrencies:
            point = simulate(source, make_policy(policy_name), profile, C, gamma or 1, requests, temps, cost,
                             cost_aware)  # fmt: skip
            points.append({"policy": policy_name, "drafter": name, "profile": profile.name, **point})
    return points


def gpu_draft_costs(config: RooflineConfig | None = None) -> dict[str, DraftCost]:
    """Drafting on the modelled H200 next to the 8 B target (32 layers): DSpark = 2 decoder layers at the
    target's width + the LM head (about 1.0 B parameters read per pass, one pass over the γ = 7 block, its KV
    cache 2/32 of the target's); MTP-1 = 1 layer + the LM head (about 0.77 B, one token, KV 1/32)."""
    config = config or RooflineConfig()
    return {"dspark": roofline_draft_cost(config, 1.0e9, 7, parallel=True, kv_fraction=2 / 32),
            "mtp": roofline_draft_cost(config, 0.77e9, 1, parallel=False, kv_fraction=1 / 32)}  # fmt: skip


def at_matched_throughput(points: list[dict], policy: str, baseline: str = "mtp1") -> list[dict]:
    """For each baseline point, `policy`'s tokens/s per user at the same throughput (linear
    interpolation along its frontier; points outside its range are skipped)."""
    mine = sorted((p["throughput"], p["tps_per_user"]) for p in points if p["policy"] == policy)
    rows = []
    for b in sorted((p for p in points if p["policy"] == baseline), key=lambda p: p["throughput"]):
        x = b["throughput"]
        for (x0, y0), (x1, y1) in zip(mine, mine[1:]):
            if x0 <= x <= x1 and x1 > x0:
                y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                rows.append({"throughput": x, "baseline_tps_per_user": b["tps_per_user"], "tps_per_user": y,
                             "gain": y / b["tps_per_user"] - 1, "baseline_concurrency": b["concurrency"]})  # fmt: skip
                break
    return rows


def policy_traces(
    target: Transformer,
    tokenizer: Tokenizer,
    policies: list[str],
    params: SamplingParams,
    refresh: bool = False,
    target_name: str = "tiny",
) -> dict[str, tuple[list[RequestTrace], torch.Tensor | None]]:
    """`record_traces` of every drafter the policies use (and of DSpark, which `none` replays)."""
    traces = {}
    for name in {drafter_for(p)[0] for p in policies} | {"dspark"}:
        if name != "none":
            gamma = drafter_for("mtp1" if name == "mtp" else "dspark")[1]
            traces[name] = record_traces(
                target, tokenizer, name, gamma, params, refresh=refresh, target_name=target_name
            )
    return traces


def frontier_report(points: list[dict], policies: list[str]) -> str:
    """Markdown: every point, then (when MTP-1 ran) each policy's tokens/s per user at MTP-1's throughputs."""
    header = ["policy", "drafter", "C", "throughput tok/s", "decode tok/s per user (1/TPOT)", "TPOT ms", "mean ℓ",
              "τ"]  # fmt: skip
    body = [[p["policy"], p["drafter"], p["concurrency"], p["throughput"], p["tps_per_user"], p["tpot_ms"],
             p["mean_verify_len"], p["tau"]] for p in points]  # fmt: skip
    paired = [(name, base) for name, base, _ in PAIRED if any(name in p for p in points)]
    for name, base in paired:  # repeated sweeps: the paired ratios with their 95% intervals
        header.append({"none": "throughput vs plain (95% CI)", "mtp1": "per user vs MTP-1 (95% CI)"}[base])
        for row, p in zip(body, points):
            r = p.get(name)
            row.append(f"{100 * (r['mean'] - 1):+.1f}% ({100 * (r['low'] - 1):+.1f}..{100 * (r['high'] - 1):+.1f}%)"
                       if r else "")  # fmt: skip
    table = tables.markdown_table(header, body)
    matched = ""
    for policy in dict.fromkeys(p["policy"] for p in points):
        if policy in ("mtp1", "none") or "mtp1" not in policies:
            continue
        for row in at_matched_throughput(points, policy):
            matched += (f"| {policy} | {row['throughput']:.1f} | {row['baseline_tps_per_user']:.2f} | "
                        f"{row['tps_per_user']:.2f} | {100 * row['gain']:+.0f}% |\n")  # fmt: skip
    if matched:
        matched = ("\nat matched throughput (MTP-1's points, the policy's frontier interpolated):\n\n"
                   "| policy | throughput | MTP-1 tok/s/user | tok/s/user | gain |\n|---|---:|---:|---:|---:|\n"
                   + matched)  # fmt: skip
    note = ("\nthroughput: all output tokens / wall time; decode tok/s per user: mean of 1/TPOT, TPOT = (E2E − TTFT)"
            " / (n − 1), which leaves out queueing, prefill and the first token (at C = 1 it can exceed the "
            "throughput); τ: committed tokens per request-round.\n")  # fmt: skip
    return table + note + matched
