"""`bench confidence`: what DSpark's trained confidence head buys over the free online confidence.

Like paper.py: parses nothing, calls the measurement (dspark/lab/study/confidence.py), prints its tables and
returns the JSON record. The prompt-lookup drafter, the other free alternative, runs in `bench offline` beside
the trained drafters (`--drafters ...,prompt-lookup`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.drafters import default_path
from dspark.lab import cli
from dspark.lab.benchmarks.common import dtype_name, load_model, write_outputs
from dspark.lab.calibration import FIT_PROMPTS
from dspark.lab.cli import UsageError
from dspark.lab.exporting import exported
from dspark.lab.machine import cpu_description
from dspark.lab.pretrained.prompt_sets import prompts_label
from dspark.lab.profiles import named_profile
from dspark.lab.study import confidence, plots
from dspark.lab.study.tables import markdown_table
from dspark.sampling import SamplingParams


def confidence_tables(result: dict) -> str:
    """Per position ECE and AUROC of both confidences; then Algorithm 1's replay per concurrency."""
    head, online = (result["confidences"][n]["positions"] for n in confidence.CONFIDENCES)
    rows = [[h["k"], h["rounds"], h["survival_rate"], f"{100 * h['ece_after']:.1f}%", f"{100 * o['ece_after']:.1f}%",
             f"{100 * h['ece_noise_floor']:.1f}%", h["auroc"], o["auroc"]] for h, o in zip(head, online)]  # fmt: skip
    text = markdown_table(["k", "rounds", "observed survival", "ECE head + STS", "ECE online + STS",
                           "ECE noise floor (head)", "AUROC head", "AUROC online"], rows)  # fmt: skip
    low, high = result["auroc_difference_95"]
    means = [result["confidences"][n]["mean_auroc"] for n in confidence.CONFIDENCES]
    text += (f"\nmean AUROC over positions: head {means[0]:.3f}, online {means[1]:.3f}; head - online "
             f"{means[0] - means[1]:+.3f} (95% bootstrap over rounds {low:+.3f} .. {high:+.3f})\n\n")  # fmt: skip
    serve = {(r["confidence"], r["concurrency"]): r for r in result["serve"]}
    names = ("fixed", "head", "online", "oracle")
    body = [[c] + [f"{serve[n, c]['throughput']:.0f} ({serve[n, c]['mean_verify_len']:.2f})" for n in names]
            + [f"{serve['online', c]['throughput'] / serve['head', c]['throughput']:.3f}"]
            for c in sorted({c for _, c in serve})]  # fmt: skip
    header = ["concurrency", "verify all", "Algorithm 1, head", "Algorithm 1, online", "Algorithm 1, oracle",
              "online / head"]  # fmt: skip
    return text + markdown_table(header, body)


def bench_confidence(args: argparse.Namespace) -> dict:
    """Fully verified rounds of the drafter on held-out prompts (0..N-1 per domain) and on the fit prompts
    (40..79), each decoded twice: with the trained head's confidences and with the drafter's own top
    probability. Both are calibrated by the same STS on the fit rounds and scored on the held-out ones (ECE,
    AUROC), then the held-out rounds are replayed through Algorithm 1 on an SPS profile: simulated throughput
    (tokens/s) and mean verify length per concurrency, beside verifying every draft and an oracle that knows
    each round's acceptances. With --out: confidence.md and confidence.png."""
    if args.temperature == 0:
        raise UsageError(
            "--temperature must be > 0: at 0 a drafter's q is one-hot and its top probability is 1"
        )
    if args.prompts_per_domain > FIT_PROMPTS[0]:
        raise UsageError(f"--prompts-per-domain must be <= {FIT_PROMPTS[0]} (prompts {FIT_PROMPTS[0]}..."
                         f"{FIT_PROMPTS[1] - 1} fit STS)")  # fmt: skip
    tokenizer, target = load_model(args)
    path = args.drafter_checkpoint or default_path(args.drafter, args.target_name)
    drafter = exported.get_drafter(args.drafter, target, Path(path))
    if not drafter.has_confidence:
        raise UsageError(f"{args.drafter} has no trained confidence head to compare with (use dspark)")
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    profile = named_profile(args.profile, target)
    params = SamplingParams(args.temperature)
    record = {}
    for part, start, n in (
        ("fit", FIT_PROMPTS[0], args.fit_prompts_per_domain),
        ("held", 0, args.prompts_per_domain),
    ):
        print(
            f"recording {part} rounds: prompts {start}..{start + n - 1} per domain, head then online",
            flush=True,
        )
        record[part] = confidence.record_both(target, drafter, tokenizer, n, start, params, gamma,
                                              args.max_new_tokens, args.prompts)  # fmt: skip
    result = confidence.compare(
        record["fit"], record["held"], profile, args.concurrency, args.requests, gamma
    )
    text = confidence_tables(result)
    print(f"\n{args.drafter}: trained head vs online confidence (its own top probability), both with STS; held-out "
          f"prompts of {prompts_label(args.prompts)}, T = {args.temperature:g}, gamma {gamma}, "
          f"{dtype_name(target)}, {cpu_description()}; Algorithm 1 replayed on the {profile.name} profile "
          f"(tokens/s, mean verify length)\n\n{text}")  # fmt: skip
    write_outputs(args, "confidence", text, lambda out: plots.plot_confidences(result, Path(out) / "confidence.png",
                                                                              f"{args.drafter}, T = {args.temperature:g}"))  # fmt: skip
    return {"benchmark": "confidence", "drafter": args.drafter, "gamma": gamma, "temperature": args.temperature,
            "prompts": prompts_label(args.prompts), "profile": profile.name, "machine": cpu_description(),
            "dtype": dtype_name(target), "rounds_fit": record["fit"]["head"].rounds,
            "rounds_held_out": record["held"]["head"].rounds, **result}  # fmt: skip
