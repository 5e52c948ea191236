"""`bench policies`: at batch 1, does the default scheduler keep every gain there is and no loss?

Per domain of held-out prompts, one request at a time, T = 0, each prompt runs in turn
through: plain decoding; the drafter with every fixed verify length ℓ (γ = ℓ, verify
all: the best a fixed choice can do on that domain); the drafter at its γ under
`generate`'s default scheduler (Algorithm 1 on this machine's measured costs); and
optional baselines (MTP-1, prompt lookup). Running them prompt by prompt interleaves
them, so a drift of the machine's speed hits all alike.

Beside tokens/s and the speed-up it shows the scheduler's decisions: the mean verify
length, the share of steps that drafted, and predicted vs realised Θ -- what the
survivals and the measured costs promised per second (Σ predicted tokens / Σ
predicted step seconds) against the tokens per second the steps delivered.

What this file does not do: choose anything (dspark/lab/cost_aware/scheduler.py).
"""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from dspark.decoding import generate
from dspark.drafters.base import Proposal
from dspark.engine import speculative_generate
from dspark.lab.benchmarks.common import dtype_name, load_model, study_prompts
from dspark.lab.benchmarks.transformers_peers import PEERS, load_peer, peer_generate
from dspark.lab.calibration import get_calibration
from dspark.lab.cli import UsageError
from dspark.lab.cost_aware.engine import CostAwareEngine
from dspark.lab.cost_aware.scheduler import CostAwareScheduler, with_drafting
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.machine import cpu_description
from dspark.lab.pretrained.fetch import resolve_model
from dspark.lab.pretrained.prompt_sets import prompts_label
from dspark.lab.study import gpu
from dspark.lab.study.tables import markdown_table
from dspark.sampling import SamplingParams
from dspark.scheduler import prefix_survival

UNLEARNT = "default, costs not learnt"  # --unlearnt's row: the one-off measured costs alone


class RecordingScheduler(CostAwareScheduler):
    """The default scheduler, also adding up what each step's decision predicted: tokens (1 per request,
    plus the survivals of the drafts it verifies) and seconds (the profile's target pass plus the drafting
    pass), and how many steps drafted."""

    def __init__(self, base: CostAwareScheduler) -> None:
        super().__init__(base.policy, base.profile, base.sts, base.draft_cost, base.learned)
        self.widths: list[int] = []
        self.steps = self.drafting_steps = 0
        self.predicted_tokens = self.predicted_seconds = 0.0

    def speculate(self, history: list, idle_steps: list[int], gamma: int) -> list[int]:
        self.widths = super().speculate(history, idle_steps, gamma)
        self.steps += 1
        if not any(self.widths):  # a plain decode step: one token per request, one pass of R tokens
            R = len(self.widths)
            self.predicted_tokens += R
            self.predicted_seconds += 1.0 / self.profile.sps(R)
        else:
            self.drafting_steps += 1
        return self.widths

    def __call__(self, proposal: Proposal) -> torch.Tensor:
        lengths = super().__call__(proposal)
        R, gamma = proposal.tokens.shape
        n_drafting = sum(1 for w in self.widths if w) if self.widths else R
        predicted = self._predicted  # (R,) verified drafts' survivals, summed by the parent for realism
        if predicted is None:  # a free drafting cost: the parent took the paper's step without them
            keep = torch.arange(gamma)[None, :] < lengths[:, None]
            predicted = prefix_survival(self.confidences(proposal), self.sts) * keep  # (R, γ)
        self.predicted_tokens += R + float(predicted.sum())
        paid = with_drafting(self.profile, self.draft_cost.seconds(n_drafting, gamma))
        self.predicted_seconds += 1.0 / paid.sps(R + int(lengths.sum()))
        return lengths


def bench_policies(args: argparse.Namespace) -> dict:
    """At batch 1, T = 0, per domain: plain decoding, the drafter at every fixed verify length 1..γ (or those of
    --lengths), and the
    drafter at γ under generate's default scheduler (Algorithm 1 with this machine's measured costs), each
    prompt through all in turn; tokens/s, speed-up, τ, mean verify length, share of steps that drafted, and
    the scheduler's predicted vs realised tokens/s. --baselines adds MTP-1 / prompt lookup rows, --transformers
    Hugging Face's own greedy and prompt-lookup `generate` on the same weights."""
    if args.transformers and not args.model:
        raise UsageError("--transformers runs Hugging Face's generate on a pretrained target: give --model")
    tokenizer, target = load_model(args)
    peer = (
        load_peer(resolve_model(args.model, quiet=True), target.embed.weight.dtype)
        if args.transformers
        else None
    )
    peers = PEERS if peer is not None else {}
    by_domain = study_prompts(args, tokenizer, target)
    drafter = get_drafter(args.drafter, target, None, args.target_name)
    gamma = min(args.gamma or drafter.max_gamma, drafter.max_gamma)
    temperatures = get_calibration(args.drafter, None, args.target_name, drafter.max_gamma)
    base = gpu.measured_scheduler("dspark", drafter, target, gamma, temperatures, requests=1)
    schedulers = {"default": base}
    # --unlearnt: the same scheduler on the one-off measurement alone, not learning from the run's steps
    if args.unlearnt:
        schedulers[UNLEARNT] = CostAwareScheduler(base.policy, base.profile, base.sts, base.draft_cost)
    baselines = {name: get_drafter(name, target, None, args.target_name) for name in args.baselines}
    lengths = [ell for ell in (args.lengths or range(1, gamma + 1)) if 1 <= ell <= gamma]
    systems = ["plain", *[f"fixed l={ell}" for ell in lengths], *schedulers, *baselines, *peers]
    params, rows = SamplingParams(0.0), []
    bar = tqdm(total=sum(map(len, by_domain.values())), desc=f"{len(systems)} systems", unit="prompt")
    for domain, prompts in by_domain.items():
        bar.set_postfix_str(domain)
        generate(target, prompts[:1], 4, params)  # warm-up
        for lookup in peers.values():
            peer_generate(peer, prompts[0], 4, None, lookup)
        tokens, seconds, taus, ells = ({s: 0.0 for s in systems} for _ in range(4))
        rounds = dict.fromkeys(systems, 0)
        totals = {name: {"steps": 0, "drafting": 0, "pred_tokens": 0.0, "pred_seconds": 0.0, "decode_s": 0.0,
                         "decode_tokens": 0} for name in schedulers}  # fmt: skip
        same = dict.fromkeys([*schedulers, *peers], 0)  # replies token for token those of plain decoding
        for i, prompt in enumerate(prompts):
            plain = generate(target, [prompt], args.max_new_tokens, params, torch.Generator().manual_seed(i),
                             tokenizer.eos_id)  # fmt: skip
            tokens["plain"] += plain.new_tokens
            seconds["plain"] += plain.prefill_seconds + plain.decode_seconds
            runs = [(f"fixed l={ell}", drafter, ell, None) for ell in lengths]
            runs += [(name, drafter, gamma, RecordingScheduler(b)) for name, b in schedulers.items()]
            runs += [(name, d, d.max_gamma, None) for name, d in baselines.items()]
            for name, d, g, sched in runs:
                r = speculative_generate(target, d, [prompt], args.max_new_tokens, params, g,
                                         torch.Generator().manual_seed(i), tokenizer.eos_id, sched, CostAwareEngine)  # fmt: skip
                tokens[name] += r.new_tokens
                seconds[name] += r.prefill_seconds + r.decode_seconds
                taus[name] += sum(rec.emitted for rec in r.stats.all_rounds())
                ells[name] += sum(rec.verify_len for rec in r.stats.all_rounds())
                rounds[name] += r.stats.rounds
                if sched is not None:
                    same[name] += r.tokens == plain.tokens
                    t = totals[name]
                    t["steps"] += sched.steps
                    t["drafting"] += sched.drafting_steps
                    t["pred_tokens"] += sched.predicted_tokens
                    t["pred_seconds"] += sched.predicted_seconds
                    t["decode_s"] += r.decode_seconds
                    t["decode_tokens"] += r.new_tokens - 1  # the prefill's token is not a step's
            for name, lookup in peers.items():
                new, took = peer_generate(peer, prompt, args.max_new_tokens, tokenizer.eos_id, lookup)
                tokens[name] += len(new)
                seconds[name] += took
                same[name] += [new] == plain.tokens
            bar.update()
        base_tps = tokens["plain"] / seconds["plain"]
        for name in systems:
            tps = tokens[name] / seconds[name]
            row = {"domain": domain, "system": name, "tokens_per_s": tps, "speedup": tps / base_tps,
                   "tau": None if name in peers else taus[name] / rounds[name] if rounds[name] else 1.0,
                   "mean_verify_len": ells[name] / rounds[name] if rounds[name] else 0.0}  # fmt: skip
            if name in peers:
                row["same_text_as_plain"] = f"{same[name]}/{len(prompts)}"
            if name in schedulers:
                t = totals[name]
                row |= {"drafted_share": t["drafting"] / max(1, t["steps"]),
                        "predicted_tokens_per_s": t["pred_tokens"] / max(t["pred_seconds"], 1e-9),
                        "realised_tokens_per_s": t["decode_tokens"] / max(t["decode_s"], 1e-9),
                        "same_text_as_plain": f"{same[name]}/{len(prompts)}"}  # fmt: skip
            rows.append(row)
    bar.close()
    machine = f"{cpu_description()}, {dtype_name(target)}"
    print(f"batch 1, T = 0, {args.max_new_tokens} new tokens, {args.target_name} + {args.drafter} (γ {gamma}), "
          f"held-out prompts {'of ' + prompts_label(args.prompts) + ' ' if args.prompts else ''}per domain: "
          f"{', '.join(f'{d} {len(p)}' for d, p in by_domain.items())}; {machine}\n")  # fmt: skip
    print(policies_table(rows, systems, list(by_domain)))
    print(decisions_table([r for r in rows if r["system"] in schedulers]))
    if peers:
        print(peers_note(rows, list(peers)))
    return {"benchmark": "policies", "target": args.target_name, "drafter": args.drafter, "gamma": gamma,
            "machine": machine, "max_new_tokens": args.max_new_tokens, "prompts": prompts_label(args.prompts),
            "prompts_measured": {d: len(p) for d, p in by_domain.items()}, "results": rows,
            "profile": base.profile.steps_per_second[: 2 * (gamma + 1)], "draft_cost": base.draft_cost.name}  # fmt: skip


def policies_table(rows: list[dict], systems: list[str], domains: list[str]) -> str:
    """Speed-up over plain decoding (τ) per system and domain, and the mean over domains."""
    cells = []
    for system in systems:
        mine = {r["domain"]: r for r in rows if r["system"] == system}
        mean = sum(mine[d]["speedup"] for d in domains) / len(domains)
        cells.append([system, *(speed_cell(mine[d]) for d in domains), f"{mean:.2f}"])
    return markdown_table(["system", *domains, "mean"], cells)


def speed_cell(row: dict) -> str:
    """ "1.53 (τ 1.82)"; a peer's τ is not observed, its cell is the speed-up alone."""
    return f"{row['speedup']:.2f}" + ("" if row["tau"] is None else f" (τ {row['tau']:.2f})")


def peers_note(rows: list[dict], peers: list[str]) -> str:
    """Which peers' replies are token for token this project's plain decoding, per domain."""
    same = [f"{r['system']} {r['domain']} {r['same_text_as_plain']}" for r in rows if r["system"] in peers]
    return "\nsame text as this project's plain decoding: " + ", ".join(same)


def decisions_table(rows: list[dict]) -> str:
    """The schedulers' decisions per domain."""
    head = ["scheduler", "domain", "speed-up", "mean ℓ", "steps drafted", "predicted tok/s", "realised tok/s",
            "same text"]  # fmt: skip
    cells = [[r["system"], r["domain"], f"{r['speedup']:.2f}", f"{r['mean_verify_len']:.2f}",
              f"{r['drafted_share']:.0%}", f"{r['predicted_tokens_per_s']:.1f}", f"{r['realised_tokens_per_s']:.1f}",
              r["same_text_as_plain"]] for r in rows]  # fmt: skip
    return "\nthe schedulers' decisions\n\n" + markdown_table(head, cells)
