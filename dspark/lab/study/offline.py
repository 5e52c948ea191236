"""The offline study of the DSpark drafter at this project's scale (paper section 4.2-4.3).

Measurements behind `python -m dspark.bench ar|offline|depth|gamma|threshold|calibration`
(the `run_*` functions and the markdown tables they print), on the held-out
prompts of each domain (their figures: dspark/lab/study/plots.py):

  * position-wise conditional acceptance (paper Fig. 2) over the rows of
    `bench offline`, which also gives the Table 1 analogue;
  * drafter depth (Fig. 3): `measure_tau` for drafters with 1, 2, ... layers;
  * proposal length (Fig. 4): `measure_tau` at several verify lengths of a
    drafter trained with a long block, and `round_latency` -- one drafting
    pass + one target verification pass at a given batch -- with and without
    the sequential head;
  * static confidence-threshold sweep (Fig. 5): `threshold_sweep` replays
    fully verified rounds. With lossless verification a round that verifies
    ℓ drafts accepts min(ℓ, a) of them, where a is what full verification
    accepted (position k's accept/reject never depends on later positions),
    so one recorded run answers every threshold.

A threshold θ verifies the longest prefix whose *survival* Π_{j<=k} c_j is at
least θ (θ = 0: everything) -- the quantity the prefix scheduler ranks (dspark/scheduler.py).

What this file does not do: train drafters (`dspark.train drafter`), fit the
confidence calibration (dspark/calibration.py; `record_rounds`
only records the rounds it is fitted and scored on), or parse arguments.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.checkpoint import config_path
from dspark.decoding import generate
from dspark.device import model_device
from dspark.drafters.base import Drafter, TargetFeatures
from dspark.engine import speculative_generate
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.scheduler import CostAwareScheduler
from dspark.lab.data.corpus import eval_prompts_by_domain
from dspark.lab.data.prompt_files import prompt_ids_by_domain
from dspark.lab.study.tau_intervals import prompt_counts
from dspark.model import Transformer
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.scheduler import FixedPolicy, Scheduler, ThroughputProfile
from dspark.tokenizer import Tokenizer


def prompts_by_domain(
    tokenizer: Tokenizer,
    per_domain: int,
    start: int = 0,
    context: int | None = None,
    prompts_file: str | Path | None = None,
) -> dict[str, list[list[int]]]:
    """Held-out chat prompts (token ids) per domain, numbers start .. start+per_domain-1 of
    each domain's eval prompts: the same ones for every drafter. With `context`, prompts
    that leave no room to generate in it are left out. With `prompts_file` (`--prompts`), that file's
    held-out prompts instead (one that does not fit `context` is refused, not left out)."""
    if prompts_file is not None:
        return prompt_ids_by_domain(prompts_file, tokenizer, context or 1 << 62, per_domain, start)
    groups = eval_prompts_by_domain(start + per_domain).items()
    ids = {d: [tokenizer.chat_prompt(t) for t in texts[start:]] for d, texts in groups}
    return {d: [p for p in ps if context is None or len(p) < context] for d, ps in ids.items()}


def measure_tau(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    params: SamplingParams,
    gamma: int,
    max_new_tokens: int,
    eos_id: int | None,
    verify_len: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
) -> RoundStats:
    """Speculative decoding of `prompts` in batches; the drafter proposes `gamma`
    tokens per round and every round verifies `verify_len` of them (default: all)."""
    rounds = RoundStats()
    fixed = None
    if verify_len is not None:
        if not 0 <= verify_len <= gamma:
            raise ValueError(f"verify_len must be in 0..{gamma}")
        fixed = Scheduler(FixedPolicy("fixed", verify_len), ThroughputProfile([1.0]))  # (no profile is read)
    for start in range(0, len(prompts), batch_size):
        result = speculative_generate(target, drafter, prompts[start : start + batch_size], max_new_tokens,
                                      params, gamma, torch.Generator().manual_seed(seed + start), eos_id,
                                      fixed)  # fmt: skip
        rounds.extend(result.stats)
    return rounds


def threshold_sweep(rounds: RoundStats, thresholds: list[float]) -> list[dict]:
    """Replay fully verified rounds under static survival thresholds.

    For each θ: ℓ = number of leading positions with Π_{j<=k} c_j >= θ,
    accepted = min(ℓ, a), rejected = ℓ - accepted; reported per round (step)
    together with the acceptance rate accepted / verified."""
    flat = [(ell, a, c) for L, A, C in zip(rounds.verify_lens, rounds.accepted, rounds.confidences)
            for ell, a, c in zip(L, A, C)]  # fmt: skip
    if not flat:
        raise ValueError("no rounds with confidences to replay (does the drafter have a confidence head?)")
    if any(ell != len(c) for ell, _, c in flat):
        raise ValueError("threshold_sweep needs fully verified rounds (ℓ = γ in every round)")
    survivals = [torch.tensor(c, dtype=torch.float64).cumprod(0) for _, _, c in flat]
    rows = []
    for theta in thresholds:
        acc = rej = 0
        for (_, a, _), surv in zip(flat, survivals):
            below = (surv < theta).nonzero()
            ell = int(below[0]) if len(below) else len(surv)
            acc += min(ell, a)
            rej += ell - min(ell, a)
        n = len(flat)
        rows.append({"threshold": theta, "accepted_per_step": acc / n, "rejected_per_step": rej / n,
                     "acceptance_rate": acc / (acc + rej) if acc + rej else None})  # fmt: skip
    return rows


@torch.no_grad()
def round_latency(
    target: Transformer,
    drafter: Drafter,
    prompts: list[list[int]],
    gamma: int,
    params: SamplingParams,
    repeats: int = 20,
) -> dict:
    """Median wall-clock of one speculative round for a batch of requests:
    drafting γ tokens each (`propose`) + one ragged target pass over
    anchor + γ drafts each. The caches are rolled back after every round so
    every repeat sees the same contexts. Parallel drafters only (their
    context cache accepts a round that commits nothing)."""
    from dspark.drafters.parallel import ParallelDrafter

    if not isinstance(drafter, ParallelDrafter):
        raise ValueError(f"round_latency times the parallel drafters (dflash, dspark*), not {drafter.name!r}")
    n, device = len(prompts), model_device(target)
    cache = target.new_cache(n)
    drafter.reset(cache.n_slots)
    slots = torch.tensor([cache.allocate() for _ in prompts], device=device)
    lens = torch.tensor([len(p) for p in prompts], device=device)
    flat = torch.tensor([t for p in prompts for t in p], device=device)
    res = target.forward_cached(flat, slots, lens, cache, return_taps=True)
    anchors = sample(probabilities(res.logits[torch.cumsum(lens, 0) - 1], params), torch.Generator())
    generator = torch.Generator().manual_seed(0)
    features, committed, committed_lens = TargetFeatures(res.taps, res.last_hidden), flat, lens
    draft_ms, verify_ms = [], []
    start = cache.lengths[slots].clone()
    wait(device)
    for rep in range(repeats + 1):  # the first round is a warm-up (and appends the prompt context)
        t0 = time.perf_counter()
        drafts = drafter.propose(
            slots, committed, features, committed_lens, anchors, gamma, params, generator
        ).tokens
        wait(device)  # the clock reads what the device did
        t1 = time.perf_counter()
        blocks = torch.cat([anchors[:, None], drafts], dim=1).flatten()
        block_lens = torch.full((n,), gamma + 1, device=device)
        target.forward_cached(blocks, slots, block_lens, cache, return_taps=True)
        wait(device)
        t2 = time.perf_counter()
        for s, length in zip(slots.tolist(), start.tolist()):
            cache.rollback(s, length)
        # nothing new is committed, so later rounds append no context to the drafter
        committed, committed_lens = flat[:0], torch.zeros(n, dtype=torch.long, device=device)
        features = TargetFeatures(features.taps[:0], features.last_hidden[:0])
        if rep:
            draft_ms.append(1000 * (t1 - t0))
            verify_ms.append(1000 * (t2 - t1))
    draft, verify = statistics.median(draft_ms), statistics.median(verify_ms)
    return {"batch": n, "gamma": gamma, "draft_ms": draft, "verify_ms": verify, "round_ms": draft + verify}


def wait(device: torch.device) -> None:
    """Let a CUDA device finish what was queued, so the wall clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the measurements behind `python -m dspark.bench ar|offline|depth|gamma|threshold|calibration` ----
def macro(values: list[float]) -> float:
    return sum(values) / len(values)


def eval_prompt_ids(tokenizer: Tokenizer, n: int) -> list[list[int]]:
    """n held-out prompts, cycling through the domains (code, math, chat, code, ...)."""
    groups = list(eval_prompts_by_domain().values())
    return [tokenizer.chat_prompt(groups[i % len(groups)][i // len(groups)]) for i in range(n)]


def run_ar(
    model: Transformer, tokenizer: Tokenizer, batch_sizes: list[int], max_new_tokens: int, repeats: int
) -> list[dict]:
    """Plain greedy decoding of exactly `max_new_tokens` per request at each batch size:
    medians over `repeats` timed runs after one warm-up."""
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.0)
    rows = []
    for batch in batch_sizes:
        prompts = eval_prompt_ids(tokenizer, batch)
        runs = []
        for rep in range(repeats + 1):  # the first run is a warm-up
            # eos_id=None: every request generates exactly max_new_tokens
            result = generate(model, prompts, max_new_tokens, params, eos_id=None)
            if rep:
                runs.append(result)
        decode_tps = [batch * (max_new_tokens - 1) / r.decode_seconds for r in runs]
        rows.append(
            {
                "batch": batch,
                "new_tokens_per_request": max_new_tokens,
                "tokens_per_s": statistics.median(r.tokens_per_s for r in runs),
                "decode_tokens_per_s": statistics.median(decode_tps),
                "tokens_per_s_per_request": statistics.median(r.tokens_per_s for r in runs) / batch,
                "ms_per_step": 1000 * statistics.median(r.decode_seconds / r.steps for r in runs),
                "prefill_ms": 1000 * statistics.median(r.prefill_seconds for r in runs),
            }
        )
    return rows


def drafter_row(
    name: str,
    domain: str,
    temperature: float,
    gamma: int,
    stats: RoundStats,
    tokens_per_s: float | None = None,
    speedup: float | None = None,
) -> dict:
    """One drafter's row of `bench offline` (domain, temperature): τ, acceptance by position with its counts,
    the mean verify length, the per-prompt counts behind the τ intervals, and tokens/s and speed-up where
    timed (None otherwise)."""
    tokens, rounds = prompt_counts(stats)
    return {"drafter": name, "domain": domain, "temperature": temperature, "gamma": gamma, "tau": stats.tau,
            "cond_acceptance": stats.acceptance_by_position(gamma), "cond_tries": stats.acceptance_counts(gamma)[1],
            "rounds": stats.rounds, "mean_verify_len": stats.mean_verify_len, "tokens_per_s": tokens_per_s,
            "speedup": speedup, "prompt_tokens": tokens, "prompt_rounds": rounds}  # fmt: skip


def run_speedup(
    target: Transformer,
    drafters: dict[str, Drafter],
    by_domain: dict[str, list[list[int]]],
    temperatures: list[float],
    gammas: dict[str, int],
    max_new_tokens: int,
    eos_id: int | None,
    scheduler_for: Callable[[str, Drafter], CostAwareScheduler | None] | None = None,
) -> list[dict]:
    """Single stream (one request at a time), per temperature, domain and drafter (drafting `gammas[name]`
    tokens per round): tau, conditional acceptance by position, tokens/s and the speed-up over plain
    decoding (row drafter "none"). Each prompt runs plainly and then with every drafter before the next
    prompt, so a drift of the machine's speed hits them alike. `scheduler_for(name, drafter)` gives a
    fresh verify-length scheduler per request (None or no function: verify all γ drafts). At T = 0
    each row also counts the prompts whose text equals plain decoding's (`same_as_plain`)."""
    rows = []
    total = len(temperatures) * sum(map(len, by_domain.values()))
    bar = tqdm(total=total, desc=f"plain + {len(drafters)} drafter(s)", unit="prompt")
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature)
        for domain, prompts in by_domain.items():
            bar.set_postfix_str(f"T={temperature:g} {domain}")
            generate(target, prompts[:1], 4, params)  # warm-up
            tokens, seconds = (
                {"none": 0, **dict.fromkeys(drafters, 0)},
                {"none": 0.0, **dict.fromkeys(drafters, 0.0)},
            )
            stats = {name: RoundStats() for name in drafters}
            same = dict.fromkeys(drafters, 0)
            for i, prompt in enumerate(prompts):
                base = generate(
                    target, [prompt], max_new_tokens, params, torch.Generator().manual_seed(i), eos_id
                )
                tokens["none"] += base.new_tokens
                seconds["none"] += base.prefill_seconds + base.decode_seconds
                for name, drafter in drafters.items():
                    sched = scheduler_for(name, drafter) if scheduler_for else None
                    r = speculative_generate(target, drafter, [prompt], max_new_tokens, params, gammas[name],
                                             torch.Generator().manual_seed(i), eos_id, sched, CostAwareEngine)  # fmt: skip
                    tokens[name] += r.new_tokens
                    seconds[name] += r.prefill_seconds + r.decode_seconds
                    stats[name].extend(r.stats)
                    same[name] += r.tokens == base.tokens
                bar.update()
            base_tps = tokens["none"] / seconds["none"]
            rows.append({"drafter": "none", "domain": domain, "temperature": temperature, "gamma": 0,
                         "tau": 1.0, "cond_acceptance": [], "tokens_per_s": base_tps, "speedup": 1.0})  # fmt: skip
            for name in drafters:
                tps = tokens[name] / seconds[name]
                row = drafter_row(name, domain, temperature, gammas[name], stats[name], tps, tps / base_tps)
                if temperature == 0:
                    row["same_as_plain"] = f"{same[name]}/{len(prompts)}"
                rows.append(row)
    bar.close()
    return rows


def run_tau(
    target: Transformer,
    drafters: dict[str, Drafter],
    by_domain: dict[str, list[list[int]]],
    temperatures: list[float],
    gammas: dict[str, int],
    max_new_tokens: int,
    eos_id: int | None,
    batch_size: int,
) -> list[dict]:
    """`run_speedup`'s rows without the clock: τ and acceptance by position per temperature, domain and
    drafter (every draft verified), `batch_size` prompts at a time and no plain decoding -- the same
    quantities from the same prompts, many times faster when there are many prompts. No tokens/s, no
    speed-up (None)."""
    rows = []
    bar = tqdm(total=len(temperatures) * len(by_domain) * len(drafters), desc="tau only", unit="domain")
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature)
        for domain, prompts in by_domain.items():
            for name, drafter in drafters.items():
                bar.set_postfix_str(f"T={temperature:g} {domain} {name}")
                stats = measure_tau(target, drafter, prompts, params, gammas[name], max_new_tokens, eos_id,
                                    batch_size=batch_size)  # fmt: skip
                rows.append(drafter_row(name, domain, temperature, gammas[name], stats))
                bar.update()
    bar.close()
    return rows


def load_labelled_drafters(
    target: Transformer, specs: list[str], target_name: str = "tiny"
) -> dict[str, Drafter]:
    """`label=PATH` pairs (or a bare name of a drafter shipped for `target_name`) -> {label: drafter}; labels
    must be non-empty and distinct (`labelled_specs`)."""
    from dspark.lab.exporting.exported import get_drafter, load_any

    out = {}
    for label, path in labelled_specs(specs):
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(
                    f"no drafter checkpoint at {path} (train it with `python -m dspark.train drafter`)"
                )
            out[label] = load_any(path, target)
        else:
            out[label] = get_drafter(label, target, target_name=target_name)
    return out


def run_depth(
    target: Transformer,
    checkpoints: dict[tuple[str, int], Path],
    by_domain: dict[str, list[list[int]]],
    params: SamplingParams,
    gamma: int | None,
    max_new_tokens: int,
    eos_id: int | None,
    draft_batches: Sequence[int] = (),
) -> list[dict]:
    """tau per domain (and macro) of each (kind, layers) drafter checkpoint (Fig. 3), each drafting
    `gamma` tokens per round (None: its own block size). The macro row also holds the checkpoint's
    validation c* (its JSON), its size in MB, and the median ms of one drafting pass (`propose`) at each
    of `draft_batches` requests (`measure_draft_cost`: a parallel drafter's one pass, a chain's γ)."""
    from dspark.lab.cost_aware.draft_cost import measure_draft_cost
    from dspark.lab.exporting.exported import load_any

    rows = []
    for (kind, layers), path in checkpoints.items():
        drafter = load_any(path, target)
        g = drafter.max_gamma if gamma is None else gamma  # the Engine refuses a γ the drafter cannot draft
        for domain, prompts in by_domain.items():
            rounds = measure_tau(target, drafter, prompts, params, g, max_new_tokens, eos_id)
            rows.append({"kind": kind, "layers": layers, "domain": domain, "tau": rounds.tau})
        tau = [r["tau"] for r in rows[-len(by_domain) :]]
        summary = {"kind": kind, "layers": layers, "domain": "macro", "tau": macro(tau),
                   "megabytes": path.stat().st_size / 1e6, "val_c_star": validation_acceptance(path)}  # fmt: skip
        if draft_batches:
            cost = measure_draft_cost(target, drafter, g, sorted(set(draft_batches)))
            summary["draft_ms"] = {n: 1000 * cost.seconds(n) for n in draft_batches}
        rows.append(summary)
    return rows


def recorded_meta(checkpoint: Path, key: str) -> object | None:
    """What `train drafter` recorded under `key` in the checkpoint's JSON (None: not recorded)."""
    meta_file = config_path(checkpoint)
    if not meta_file.is_file():
        return None
    return json.loads(meta_file.read_text()).get("meta", {}).get(key)


def validation_acceptance(checkpoint: Path) -> list[float] | None:
    """The validation expected acceptance c* per position that `train drafter` wrote into the checkpoint's
    JSON (None: not recorded)."""
    return recorded_meta(checkpoint, "val_expected_acceptance")


def trained_epochs(checkpoint: Path) -> float | None:
    """The epochs `train drafter` had run when it wrote the checkpoint (its JSON; None: not recorded)."""
    return recorded_meta(checkpoint, "epochs")


def run_gamma(
    target: Transformer,
    drafters: dict[str, Drafter],
    by_domain: dict[str, list[list[int]]],
    params: SamplingParams,
    gammas: list[int],
    max_new_tokens: int,
    eos_id: int | None,
    latency_batch: int,
    repeats: int,
) -> tuple[list[dict], list[dict]]:
    """tau per domain when only the first γ drafts of each full block are verified, and the
    round latency at `latency_batch` requests, per drafter and γ (Fig. 4)."""
    tau_rows, latency_rows = [], []
    for label, drafter in drafters.items():
        for domain, prompts in by_domain.items():
            for gamma in gammas:  # the drafter proposes its full block; only the first γ are verified
                rounds = measure_tau(target, drafter, prompts, params, drafter.max_gamma, max_new_tokens, eos_id,
                                     verify_len=gamma)  # fmt: skip
                tau_rows.append({"kind": label, "domain": domain, "gamma": gamma, "tau": rounds.tau})
        batch = [p for ps in by_domain.values() for p in ps][:latency_batch]
        for gamma in gammas:
            row = round_latency(target, drafter, batch, gamma, params, repeats)
            latency_rows.append({"kind": label, **row})
    return tau_rows, latency_rows


def run_threshold(
    target: Transformer,
    drafter: Drafter,
    by_domain: dict[str, list[list[int]]],
    params: SamplingParams,
    gamma: int,
    max_new_tokens: int,
    eos_id: int | None,
    thresholds: list[float],
) -> list[dict]:
    """`threshold_sweep` of fully verified rounds, per domain (Fig. 5)."""
    rows = []
    for domain, prompts in by_domain.items():
        rounds = measure_tau(target, drafter, prompts, params, gamma, max_new_tokens, eos_id)
        rows += [{"domain": domain, **row} for row in threshold_sweep(rounds, thresholds)]
    return rows


def record_rounds(
    target: Transformer,
    drafter: Drafter,
    tokenizer: Tokenizer,
    per_domain: int,
    params: SamplingParams,
    gamma: int,
    max_new_tokens: int,
    start: int = 0,
    on_domain: Callable[[str, RoundStats], None] | None = None,
    samples: int = 1,
    prompts_file: str | Path | None = None,
) -> RoundStats:
    """Fully verified rounds on eval prompts start .. start+per_domain-1 of every domain (what STS is
    fitted and scored on; `prompts_file`: that file's held-out prompts instead of the shipped ones), each
    prompt decoded `samples` times with other random draws (more rounds: a lower ECE noise floor);
    `on_domain(domain, rounds so far)` after each domain."""
    rounds = RoundStats()
    by_domain = prompts_by_domain(tokenizer, per_domain, start, target.config.max_seq_len, prompts_file)
    for domain, prompts in by_domain.items():
        for draw in range(samples):
            rounds.extend(measure_tau(target, drafter, prompts, params, gamma, max_new_tokens, tokenizer.eos_id,
                                      seed=1_000_003 * draw))  # fmt: skip
        if on_domain:
            on_domain(domain, rounds)
    return rounds


def labelled_specs(specs: list[str]) -> list[tuple[str, str]]:
    """`LABEL=CHECKPOINT` or bare shipped names (the `--drafters` of the benchmarks) -> [(label, checkpoint or
    '')]; a ValueError for an empty label or checkpoint, or a label given twice (one would replace the other)."""
    pairs, seen = [], set()
    for spec in specs:
        label, eq, path = (part.strip() for part in spec.partition("="))
        if not label:
            raise ValueError(f"--drafters: {spec!r} has no label; write LABEL=CHECKPOINT")
        if eq and not path:
            raise ValueError(f"--drafters: {spec!r} names no checkpoint after '='")
        if label in seen:
            raise ValueError(
                f"--drafters: the label {label!r} is given twice; give each drafter its own label"
            )
        seen.add(label)
        pairs.append((label, path))
    return pairs
