"""The GPU benchmark behind `python -m dspark.bench gpu`: the shipped models on a CUDA GPU, in one record.

Sections, in the order `run` measures them (each a function here):

  * `kernel_rows`: each Triton kernel against its PyTorch reference at the shipped shapes
    (`study.kernels.compare`);
  * `sps_section`: SPS(B), target passes per second at B batch tokens, measured on the device by
    `profiler.measure_sps` as it is -- through `OnDevice`, which moves the profiler's CPU-made inputs
    to the model's device and waits for each pass, so its wall-clock timing is the pass's -- next to
    the H200 roofline model the simulator uses;
  * `batch1_rows`: plain vs speculative decoding at batch 1 per drafter (mtp, eagle, dflash, dspark;
    `offline.run_speedup`): tokens/s, τ and speed-up, macro-averaged over the domains;
  * `engine_points`: the serving engine, closed loop at each concurrency C, for the policies none,
    mtp1, fixed and dspark (`pareto.serve_points`; dspark schedules with the SPS measured above);
  * `compile_rows`: one target step (a decode and a verify shape), plain vs `torch.compile`, both
    measured, with the largest logit difference (CUDA graphs cannot capture a step that reads the host,
    so mode "reduce-overhead" is tried and reported for what it does);
  * `sync_rows`: device-to-host reads per engine step per policy, counted (dspark/device.py) and, on
    CUDA, measured with torch.cuda's sync debug mode (every synchronising call, uploads included);
  * `training_rows`: drafter training at the paper's sizes (DSpark and DFlash 5 layers, Markov rank 256;
    EAGLE-3 1 layer; MTP-1), every response position an anchor, bf16 autocast on CUDA: anchors per second.

SmolLM2, a real target, is a named placeholder until that issue lands. `GPU_PLAN` sizes the run to
fit about 8 minutes of an H200 (`Plan.expected_s` says how long); `DRY_PLAN` (`--dry-run`) runs every
section on the CPU at tiny sizes in seconds, kernels in Triton's interpreter (skipped without
Triton), so the test suite can run this whole file.

What this file does not do: parse arguments or print tables (dspark/lab/commands/bench.py), or time anything
on a CPU that means anything (the dry run checks the plumbing, not speed).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from dspark import profiler
from dspark.device import model_device
from dspark.drafters import PARALLEL_KINDS
from dspark.drafters.base import Drafter, NoDrafter
from dspark.engine import Request, speculative_generate
from dspark.lab import profiles, storage
from dspark.lab.calibration import get_calibration
from dspark.lab.cost_aware.draft_cost import DraftCost
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.learned_costs import LearnedCosts
from dspark.lab.cost_aware.scheduler import COST_AWARE, CostAwareScheduler
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.host_reads import HostReads
from dspark.lab.machine import MeasureProgress
from dspark.lab.step_cost import engine_draft_cost
from dspark.lab.study import kernels as kernel_study
from dspark.lab.study import offline, pareto
from dspark.lab.study.tables import markdown_table
from dspark.lab.study.training_speed import time_training_steps
from dspark.lab.training.drafters import DrafterTrainConfig, new_drafter
from dspark.lab.training.feature_cache import LiveFeatures
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.scheduler import ThroughputProfile, make_policy
from dspark.tokenizer import Tokenizer

DRAFTERS = ("mtp", "eagle", "dflash", "dspark")
POLICIES = ("none", "mtp1", "fixed", "dspark")
TRAINING_SIZES = (
    ("dspark", 5),
    ("dflash", 5),
    ("eagle", 1),
    ("mtp", 1),
)  # layers per kind, the paper's (§4.1)
SMOLLM2 = "pending: needs the real-target issue"


@dataclass(frozen=True)
class Plan:
    """How much of each section runs."""

    name: str
    expected_s: int  # about how long the whole run takes (the GPU plan: an H200's estimate)
    kernel_sizes: tuple[int, ...]  # requests per kernel comparison
    kernel_repeats: int
    sps_points: tuple[int, ...]  # batch tokens B measured
    sps_requests: int  # B tokens spread over up to this many requests
    sps_context: int  # tokens of KV each of them holds
    sps_repeats: int
    prompts_per_domain: int  # batch-1 decoding
    max_new_tokens: int
    concurrency: tuple[int, ...]  # engine
    min_requests: int  # requests per engine point: max(min_requests, 2·C)
    serve_tokens: int
    compile_shapes: tuple[tuple[int, int], ...]  # (requests, tokens per request) of a target step
    compile_modes: tuple[str, ...]
    compile_backend: str
    compile_repeats: int
    sync_concurrency: int
    sync_requests: int
    train_steps: int  # timed optimizer steps per drafter kind (after one warm-up step)
    train_batch: int  # sequences per step
    train_lengths: tuple[int, int]  # prompt and response tokens of each sequence

    def serve_requests(self, concurrency: int) -> int:
        return max(self.min_requests, 2 * concurrency)


GPU_PLAN = Plan(
    "h200", 370, kernel_sizes=(1, 16, 64), kernel_repeats=50,
    sps_points=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048), sps_requests=256, sps_context=128,
    sps_repeats=5, prompts_per_domain=4, max_new_tokens=128, concurrency=(1, 4, 16, 64, 256), min_requests=16,
    serve_tokens=64, compile_shapes=((1, 1), (64, 8)), compile_modes=("default", "reduce-overhead"),
    compile_backend="inductor", compile_repeats=50, sync_concurrency=4, sync_requests=8,
    train_steps=10, train_batch=32, train_lengths=(128, 320),
)  # fmt: skip
DRY_PLAN = Plan(
    "dry-run", 20, kernel_sizes=(1,), kernel_repeats=1, sps_points=(1, 2, 4, 8), sps_requests=2, sps_context=16,
    sps_repeats=1, prompts_per_domain=1, max_new_tokens=8, concurrency=(1, 2), min_requests=2, serve_tokens=8,
    compile_shapes=((1, 1),), compile_modes=("default",), compile_backend="eager", compile_repeats=2,
    sync_concurrency=2, sync_requests=2, train_steps=1, train_batch=2, train_lengths=(6, 10),
)  # fmt: skip
EXPECTED_S = {
    "kernels": 40,
    "sps": 20,
    "batch1": 45,
    "engine": 60,
    "compile": 150,
    "syncs": 15,
    "training": 40,
}  # GPU plan


class OnDevice:
    """A target for `profiler.measure_sps`, which makes its inputs on the CPU and times with the wall
    clock: the inputs are moved to the model's device and every pass is waited for, so the time
    measured is the pass's (plus the upload of B token ids)."""

    def __init__(self, target: Transformer) -> None:
        self.target, self.config = target, target.config

    def new_cache(self, n_slots: int):
        return self.target.new_cache(n_slots)

    def forward_cached(self, *args, **kwargs):
        device = model_device(self.target)
        moved = [a.to(device) if isinstance(a, torch.Tensor) and a.device != device else a for a in args]
        out = self.target.forward_cached(*moved, **kwargs)
        offline.wait(device)
        return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def measure_device_sps(
    target: Transformer, points: tuple[int, ...], requests: int, context: int, repeats: int
) -> ThroughputProfile:
    """SPS(B) on the target's device, by `profiler.measure_sps` through `OnDevice`."""
    profile = profiler.measure_sps(OnDevice(target), list(points), requests, context, repeats)
    name = f"{device_name(model_device(target))} measured"
    return ThroughputProfile(profile.steps_per_second, name)


def device_profile(target: Transformer, refresh: bool = False) -> ThroughputProfile:
    """The measured SPS profile the schedulers use, on the target's device: the cached CPU profile
    (`profiles.cpu_profile`) on a CPU; on a GPU the `GPU_PLAN` points up to 2,048 batch tokens, measured
    once and cached per model config and GPU name under DSPARK_HOME."""
    device = model_device(target)
    if device.type == "cpu":
        return profiles.cpu_profile(target, refresh=refresh)
    plan = GPU_PLAN
    context = min(plan.sps_context, target.config.max_seq_len // 2)
    room = target.config.max_seq_len - context
    points = tuple(b for b in plan.sps_points if -(-b // plan.sps_requests) <= room)
    config = asdict(target.config)
    config["tap_layers"] = list(config["tap_layers"])
    key = {"config": config, "device": device_name(device), "points": list(points), "context": context}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = storage.dspark_home() / "profiles" / f"{device.type}-{digest}.json"
    hint = "python -m dspark.bench profile --device cuda --refresh"
    cached = None if refresh else profiles.read_profile(path, key, hint)
    if cached is not None:
        return cached
    profile = measure_device_sps(target, points, plan.sps_requests, context, plan.sps_repeats)
    storage.write_cache(
        path, {"key": key, "name": profile.name, "steps_per_second": profile.steps_per_second}
    )
    return profile


def measured_scheduler(
    policy_name: str,
    drafter: Drafter,
    target: Transformer,
    gamma: int,
    temperatures: torch.Tensor | None,
    threshold: float = 0.5,
    cost_aware: bool = True,
    requests: int | None = None,
    refresh: bool = False,
) -> CostAwareScheduler | None:
    """The verify-length scheduler `python -m dspark.generate --policy NAME` runs with: the policy on
    this device's measured SPS profile (`device_profile`), the drafter's STS `temperatures`, and for a
    cost-aware policy on a CPU the drafter's measured drafting time (cached; not yet measured on a GPU).
    None for `fixed` (verify every draft) and for plain decoding. `requests`: how many requests the run
    serves at once -- on a CPU only the batch sizes they need are measured (1..requests·(γ+1) target tokens,
    1..requests drafting requests), in seconds, with a progress bar; `refresh` measures again."""
    if policy_name == "fixed" or drafter.max_gamma == 0:
        return None
    policy = make_policy(policy_name, threshold=threshold)
    # a policy the drafter cannot run is refused (the core's check) before anything is measured
    CostAwareScheduler.for_drafter(policy, drafter, ThroughputProfile([1.0]))
    if model_device(target).type != "cpu":
        return CostAwareScheduler(policy, device_profile(target, refresh), temperatures)
    drafting = policy_name in COST_AWARE and cost_aware
    # once per process and drafter, even where a busy machine kept the measurement out of the cache
    kept = _MEASURED.setdefault(drafter, {})
    key = (gamma, requests, drafting)
    if refresh or key not in kept or kept[key][0]() is not target:
        kept[key] = (weakref.ref(target), measured_costs(target, drafter, gamma, requests, refresh, drafting))
    profile, cost = kept[key][1]
    # the measured costs are the prior; the run's own steps correct them as it goes
    learned = LearnedCosts(profile, cost) if cost is not None else None
    return CostAwareScheduler(policy, profile, temperatures, cost, learned)


# `measured_scheduler`'s measurements in this process, per drafter: (γ, requests, drafting) -> (target, costs)
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def measured_costs(
    target: Transformer, drafter: Drafter, gamma: int, requests: int | None, refresh: bool, drafting: bool
) -> tuple[ThroughputProfile, DraftCost | None]:
    """This CPU's SPS profile for `requests` requests at γ and (`drafting`) the drafter's drafting cost: cached,
    or measured now under a progress bar that says what and why."""
    where = storage.dspark_home() / "profiles"
    max_tokens = None if requests is None else requests * (gamma + 1)
    tick = MeasureProgress(f"measuring this machine once (cached in {where}): how long the target takes to "
                           f"verify 1-{max_tokens or profiler.DEFAULT_POINTS[-1]} tokens and the {drafter.name} drafter "
                           "to draft, so the scheduler drafts and verifies only what pays here")  # fmt: skip
    # the drafting cost first: a cache file of it that cannot be read is one line before anything is printed
    cost = engine_draft_cost(target, drafter, gamma, refresh, requests, tick) if drafting else None
    profile = profiles.cpu_profile(target, refresh, max_tokens=max_tokens, tick=tick)
    tick.close()
    return profile, cost


# ---- the sections -----------------------------------------------------------------------------------
def kernel_rows(plan: Plan, cuda: bool) -> dict:
    """Kernels vs references (`study.kernels.compare`); on the CPU only in Triton's interpreter."""
    import dspark_kernels as kernels

    if not kernels.available():
        return {"status": f"skipped: Triton is not usable here ({kernels.unavailable_reason()})", "rows": []}
    if not cuda and not kernels.interpreting():
        return {"status": "skipped: on the CPU the kernels need TRITON_INTERPRET=1 before Triton is imported",
                "rows": []}  # fmt: skip
    rows = list(kernel_study.compare(list(plan.kernel_sizes), 7, plan.kernel_repeats, cuda))
    ok = all("DIFFER" not in row["agreement"] for row in rows)
    status = "ok" if ok else "a kernel DIFFERS from its reference"
    return {"status": status, "interpreted": not cuda, "rows": rows}


def sps_section(target: Transformer, plan: Plan) -> tuple[dict, ThroughputProfile]:
    """SPS(B) measured on the target's device (and the H200 roofline at the same points)."""
    context = min(plan.sps_context, target.config.max_seq_len // 2)
    profile = measure_device_sps(target, plan.sps_points, plan.sps_requests, context, plan.sps_repeats)
    roofline = profiles.named_profile("h200")
    record = {
        "measured": {"name": profile.name, "batch_tokens": list(plan.sps_points),
                     "steps_per_second": profile.steps_per_second, "requests": plan.sps_requests,
                     "context": context, "repeats": plan.sps_repeats},
        "h200_roofline": [roofline.sps(B) for B in plan.sps_points],  # at the same batch tokens
    }  # fmt: skip
    return record, profile


def batch1_rows(target: Transformer, tokenizer: Tokenizer, plan: Plan) -> tuple[list[dict], list[dict]]:
    """Plain vs speculative decoding, one request at a time, T = 1: per drafter the macro average over
    the domains of tokens/s, τ and the speed-up over plain decoding; and the per-domain rows."""
    drafters = {name: get_drafter(name, target) for name in DRAFTERS}
    gammas = {name: d.max_gamma for name, d in drafters.items()}
    by_domain = offline.prompts_by_domain(tokenizer, plan.prompts_per_domain, 0, target.config.max_seq_len)
    params = SamplingParams(1.0)
    warm = next(iter(by_domain.values()))[:1]
    for name, drafter in drafters.items():  # compile the kernels (on a GPU) outside the timed runs
        speculative_generate(target, drafter, warm, 4, params, gammas[name], torch.Generator().manual_seed(0))
    rows = offline.run_speedup(target, drafters, by_domain, [1.0], gammas, plan.max_new_tokens,
                               tokenizer.eos_id)  # fmt: skip
    summary = []
    for name in ("none", *DRAFTERS):
        mine = [r for r in rows if r["drafter"] == name]
        summary.append({"drafter": name, "gamma": mine[0]["gamma"],
                        "tokens_per_s": offline.macro([r["tokens_per_s"] for r in mine]),
                        "tau": offline.macro([r["tau"] for r in mine]),
                        "speedup": offline.macro([r["speedup"] for r in mine])})  # fmt: skip
    return summary, rows


def engine_points(
    target: Transformer, tokenizer: Tokenizer, plan: Plan, profile: ThroughputProfile
) -> list[dict]:
    """The engine at each concurrency, closed loop, T = 1, per policy (`pareto.serve_points`)."""
    points = []
    for C in plan.concurrency:
        points += pareto.serve_points(target, tokenizer, list(POLICIES), [C], plan.serve_requests(C),
                                      plan.serve_tokens, profile, SamplingParams(1.0))  # fmt: skip
    return points


def compile_rows(target: Transformer, plan: Plan) -> list[dict]:
    """One target step (`forward_cached` with taps, as the engine calls it) at each shape, plain and under
    `torch.compile` in each mode, each timed after warm-up, with the largest logit difference."""
    rows = []
    for mode in plan.compile_modes:
        torch._dynamo.reset()
        compiled = torch.compile(target.forward_cached, backend=plan.compile_backend, mode=_mode(mode, plan))
        for requests, tokens in plan.compile_shapes:
            row = {"mode": mode, "backend": plan.compile_backend, "requests": requests,
                   "tokens_per_request": tokens, "batch_tokens": requests * tokens}  # fmt: skip
            try:
                row |= time_step(target, compiled, requests, tokens, plan.compile_repeats)
            except Exception as exc:  # report the failure of this mode, measure the rest
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            rows.append(row)
    return rows


@torch.no_grad()
def time_step(target: Transformer, compiled: Callable, requests: int, tokens: int, repeats: int) -> dict:
    """Plain vs `compiled` forward_cached of `tokens` new tokens for each of `requests` requests that hold
    64 tokens of context (rolled back after every call, so each repeat sees the same cache)."""
    device = model_device(target)
    cuda, V = device.type == "cuda", target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    cache = target.new_cache(requests)
    slots = torch.tensor([cache.allocate() for _ in range(requests)], device=device)  # (R,)
    context = min(64, target.config.max_seq_len - tokens)
    prompt = torch.randint(0, V, (requests * context,), generator=g).to(device)
    target.forward_cached(prompt, slots, torch.full((requests,), context, device=device), cache)
    block = torch.randint(0, V, (requests * tokens,), generator=g).to(device)  # (R·tokens,)
    lens = torch.full((requests,), tokens, device=device)

    def step(fn: Callable) -> torch.Tensor:
        out = fn(block, slots, lens, cache, return_taps=True)
        cache.lengths[slots] -= lens  # roll back
        return out.logits

    reference = step(target.forward_cached)
    t0 = time.perf_counter()
    got = step(compiled)  # compiles
    offline.wait(device)
    compile_s = time.perf_counter() - t0
    plain_ms = kernel_study.timed(lambda: step(target.forward_cached), repeats, cuda)
    compiled_ms = kernel_study.timed(lambda: step(compiled), repeats, cuda)
    return {"compile_s": compile_s, "max_abs_diff": float((got.float() - reference.float()).abs().max()),
            "plain_ms": plain_ms, "compiled_ms": compiled_ms, "speedup": plain_ms / compiled_ms,
            "helps": plain_ms / compiled_ms > 1.05}  # fmt: skip


def _mode(mode: str, plan: Plan) -> str | None:
    """torch.compile's `mode`: None for "default" (and for backends other than inductor)."""
    return None if mode == "default" or plan.compile_backend != "inductor" else mode


def sync_rows(target: Transformer, tokenizer: Tokenizer, plan: Plan, profile: ThroughputProfile) -> dict:
    """Per policy: device-to-host reads per engine step, counted by the function that read (dspark/lab/host_reads.py), and on
    CUDA every synchronising call measured by torch.cuda's sync debug mode (prefill included)."""
    device = model_device(target)
    prompts = [p for ps in offline.prompts_by_domain(tokenizer, 2, 0).values() for p in ps]
    requests = [Request(prompts[i % len(prompts)], plan.serve_tokens) for i in range(plan.sync_requests)]
    params, rows = SamplingParams(1.0), []
    for policy in POLICIES:
        name, gamma = pareto.drafter_for(policy)
        drafter = NoDrafter(target.config.vocab_size) if name == "none" else get_drafter(name, target)
        scheduler = CostAwareScheduler.for_drafter(
            make_policy(policy), drafter, profile, get_calibration(name)
        )
        engine = CostAwareEngine(
            target, drafter, params, gamma, plan.sync_concurrency, tokenizer.eos_id, scheduler
        )
        engine.run(requests[:1])  # warm-up
        measured = None
        with HostReads(engine) as reads:
            if device.type == "cuda":
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        result = engine.run(requests, torch.Generator().manual_seed(0))
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                measured = sum("synchroniz" in str(w.message).lower() for w in caught)
            else:
                result = engine.run(requests, torch.Generator().manual_seed(0))
        steps = max(1, result.steps)
        rows.append({"policy": policy, "drafter": name, "steps": result.steps,
                     "counted_per_step": sum(reads.per_step) / steps, "counted_prefill": reads.prefill,
                     "by_function_per_step": {k: v / steps for k, v in reads.by_function.items()},
                     "cuda_synchronising_calls_per_step": None if measured is None else measured / steps})  # fmt: skip
    return {"counted_per_step": {r["policy"]: r["counted_per_step"] for r in rows}, "rows": rows}


# ---- the whole run ----------------------------------------------------------------------------------
def training_rows(target: Transformer, plan: Plan) -> list[dict]:
    """Seconds per optimizer step and anchors per second of each drafter kind at the paper's depth
    (`TRAINING_SIZES`; the parallel kinds with q/k norm and Markov rank 256), every response position an
    anchor, fed by a live target pass. The sequences are random tokens: how fast a step runs does not
    depend on what they say, and the benchmark needs no data on the GPU machine."""
    device = model_device(target)
    g = torch.Generator().manual_seed(0)
    prompt, response = plan.train_lengths
    vocab = target.config.vocab_size
    records = [{"prompt_ids": torch.randint(vocab, (prompt,), generator=g).tolist(),
                "response_ids": torch.randint(vocab, (response,), generator=g).tolist()}
               for _ in range(plan.train_batch * (plan.train_steps + 2))]  # fmt: skip
    source = LiveFeatures(target, records)
    tc = DrafterTrainConfig(batch_size=plan.train_batch, anchors_per_seq=0, bf16=device.type == "cuda")
    rows = []
    for kind, layers in TRAINING_SIZES:
        torch.manual_seed(0)
        parallel = kind in PARALLEL_KINDS
        drafter = new_drafter(target, kind, layers=layers, rank=256 if parallel else None, qk_norm=parallel)
        measured = time_training_steps(drafter.to(device), target, source, tc, plan.train_steps)
        rows.append({"drafter": kind, "layers": layers, "bf16": tc.bf16, **measured})
    return rows


def run(target: Transformer, tokenizer: Tokenizer, plan: Plan, say: Callable[[str], None] = print) -> dict:
    """Every section on the target's device; one record (the JSON of `bench gpu`)."""
    device = model_device(target)
    cuda = device.type == "cuda"
    start = time.perf_counter()
    record = {
        "benchmark": "gpu",
        "dry_run": plan is DRY_PLAN,
        "plan": asdict(plan),
        "device": {"type": device.type, "name": device_name(device)},
        "torch": torch.__version__,
        "smollm2": SMOLLM2,
    }
    for section, measure in (
        ("kernels", lambda: kernel_rows(plan, cuda)),
        ("sps", lambda: sps_section(target, plan)),
        ("batch1", lambda: batch1_rows(target, tokenizer, plan)),
        ("engine", lambda: engine_points(target, tokenizer, plan, record["_profile"])),
        ("compile", lambda: {"rows": compile_rows(target, plan)}),
        ("syncs", lambda: sync_rows(target, tokenizer, plan, record["_profile"])),
        ("training", lambda: training_rows(target, plan)),
    ):
        t0 = time.perf_counter()
        say(f"{section} ...")
        value = measure()
        if section == "sps":
            value, record["_profile"] = value
        if section == "batch1":
            value, record["batch1_by_domain"] = value
        record[section] = value
        record.setdefault("section_seconds", {})[section] = time.perf_counter() - t0
    del record["_profile"]
    record["seconds"] = time.perf_counter() - start
    return record


def report(record: dict) -> str:
    """Markdown of a `run` record."""
    dev = record["device"]
    dry = ", DRY RUN: tiny sizes, the timings mean nothing" if record["dry_run"] else ""
    out = [f"# GPU benchmark ({dev['name']}, {dev['type']}{dry})\n",
           f"torch {record['torch']}; {record['seconds']:.0f} s in all; SmolLM2: {record['smollm2']}\n"]  # fmt: skip
    k = record["kernels"]
    out.append(f"## Kernels vs references ({k['status']})\n")
    if k["rows"]:
        out.append(markdown_table(["kernel", "requests", "reference ms", "kernel ms", "speed-up", "agreement"],
                                  [[r["kernel"], r["requests"], r["reference_ms"], r["kernel_ms"], r["speedup"],
                                    r["agreement"]] for r in k["rows"]]))  # fmt: skip
    sps = record["sps"]["measured"]
    where = f"{sps['requests']} requests × {sps['context']} tokens of context"
    out.append(f"## SPS(B), {sps['name']} ({where})\n")
    roof = record["sps"]["h200_roofline"]
    out.append(markdown_table(["B", "measured passes/s", "H200 roofline (8B) passes/s"],
                              [[B, sps["steps_per_second"][B - 1], r] for B, r in zip(sps["batch_tokens"], roof)]))  # fmt: skip
    out.append("## Batch 1, T = 1: plain vs speculative (macro over domains)\n")
    out.append(markdown_table(["drafter", "γ", "tokens/s", "τ", "speed-up"],
                              [[r["drafter"], r["gamma"], r["tokens_per_s"], r["tau"], r["speedup"]]
                               for r in record["batch1"]]))  # fmt: skip
    out.append("## Engine, closed loop, T = 1\n")
    out.append(markdown_table(["policy", "drafter", "C", "throughput tok/s", "tok/s per user", "τ", "mean ℓ"],
                              [[p["policy"], p["drafter"], p["concurrency"], p["throughput"], p["tps_per_user"],
                                p["tau"], p["mean_verify_len"]] for p in record["engine"]]))  # fmt: skip
    out.append("## One target step: plain vs torch.compile\n")
    out.append(markdown_table(["mode", "backend", "requests × tokens", "plain ms", "compiled ms", "speed-up",
                               "compile s", "max |Δ logit|", "error"],
                              [[r["mode"], r["backend"], f"{r['requests']} × {r['tokens_per_request']}",
                                r.get("plain_ms"), r.get("compiled_ms"), r.get("speedup"), r.get("compile_s"),
                                f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else None, r.get("error")]
                               for r in record["compile"]["rows"]]))  # fmt: skip
    out.append("## Host syncs per engine step\n")
    out.append(markdown_table(["policy", "drafter", "counted per step", "CUDA synchronising calls per step",
                               "by reason, per step (prefill included)"],
                              [[r["policy"], r["drafter"], r["counted_per_step"],
                                r["cuda_synchronising_calls_per_step"],
                                "; ".join(f"{k} {v:.2f}" for k, v in r["by_function_per_step"].items())]
                               for r in record["syncs"]["rows"]]))  # fmt: skip
    out.append("## Drafter training at the paper's sizes (every response position an anchor)\n")
    out.append(markdown_table(["drafter", "layers", "bf16", "s/step", "anchors/step", "anchors/s"],
                              [[r["drafter"], r["layers"], r["bf16"], r["seconds_per_step"], r["anchors_per_step"],
                                r["anchors_per_s"]] for r in record["training"]]))  # fmt: skip
    return "\n".join(out)
