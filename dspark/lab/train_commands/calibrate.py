"""`train calibrate`: Sequential Temperature Scaling of a drafter's confidence head, fitted and stored.

`cmd_calibrate` records rounds on eval prompts 40..79 (dspark/lab/study/offline.py), selects one temperature
(and logit offset) per position (dspark/calibration.py), prints the per-position table and
stores the result where `calibration_output` says; `padded_sts` extends it to every position the
drafter can draft.

What this file does not do: fit anything itself (dspark/calibration.py) or report the
calibration on held-out prompts (`python -m dspark.bench calibration`, dspark/lab/benchmarks/paper.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dspark.checkpoint import config_path
from dspark.drafters import default_path
from dspark.drafters.parallel import KINDS as PARALLEL_KINDS
from dspark.lab import cli, storage
from dspark.lab.calibration import calibration_path, checkpoint_digest
from dspark.lab.cli import UsageError
from dspark.lab.pretrained.prompt_sets import prompts_label


def calibration_output(args: argparse.Namespace, checkpoint: Path, target_name: str) -> Path:
    """Where `train calibrate` stores what it fitted: --out; with --ship the shipped drafter's own JSON twin in
    the package; else `calibration_path` (under DSPARK_HOME for a shipped drafter, else beside the drafter)."""
    if args.out:
        if args.ship:
            raise UsageError("--out and --ship both say where the calibration goes: give one")
        return Path(args.out)
    if args.ship:
        if not storage.inside_package(checkpoint):
            raise UsageError(f"--ship stores the calibration of a shipped drafter, and {checkpoint} is not one "
                             "(without --ship it goes beside that checkpoint)")  # fmt: skip
        return config_path(checkpoint)
    return calibration_path(checkpoint, target_name)


def padded_sts(temps: torch.Tensor, reasons: list[str], positions: int) -> tuple[torch.Tensor, list[str]]:
    """STS fitted over the first --gamma positions extended to all the drafter's `positions`: T = 1 (and
    b = 0) where nothing was fitted, so that a stored calibration always covers every position."""
    missing = positions - temps.shape[-1]
    if missing <= 0:
        return temps, reasons
    identity = torch.ones(missing, dtype=temps.dtype, device=temps.device)
    if temps.dim() == 2:
        identity = torch.stack([identity, torch.zeros_like(identity)])
    note = [f"T = 1: not fitted (calibrated with --gamma {temps.shape[-1]})"] * missing
    return torch.cat([temps, identity], dim=-1), reasons + note


def cmd_calibrate(args: argparse.Namespace) -> None:
    """Decode eval prompts 40..79 of every domain (the shipped held-out set's, or --prompts FILE's) with full
    verification, record each round's confidences and accepted length, fit one temperature per position left
    to right on half of the rounds (each minimising the ECE of the prefix survival with the earlier ones fixed),
    keep it only where the other half's ECE improves and enough rounds reach the position (else T = 1), and
    store them: for a shipped drafter under DSPARK_HOME (where `generate` and `bench` look first; --ship: into
    the package), for any other in its checkpoint's JSON, or in --out. `python -m dspark.bench calibration`
    then reports on prompts 0..39.
    """

    from dspark.lab import calibration
    from dspark.lab.exporting.exported import get_drafter
    from dspark.lab.study import offline
    from dspark.sampling import SamplingParams
    from dspark.scheduler import temperatures_and_offsets

    tokenizer, target, target_name = cli.load_target(args)
    path = (
        Path(args.drafter_checkpoint) if args.drafter_checkpoint else default_path(args.drafter, target_name)
    )
    out = calibration_output(args, path, target_name)  # before the long recording
    drafter = get_drafter(args.drafter, target, path, target_name)
    if not drafter.has_confidence:
        with_head = ", ".join(kind for kind, head in PARALLEL_KINDS.items() if head != "none")
        raise UsageError(f"{args.drafter} has no trained confidence head to calibrate (use {with_head})")
    gamma = cli.resolve_gamma(args.gamma, drafter, args.drafter)
    first, last = calibration.FIT_PROMPTS

    def progress(domain: str, rounds) -> None:
        print(f"{domain}: {sum(map(len, rounds.accepted))} rounds recorded so far")

    rounds = offline.record_rounds(target, drafter, tokenizer, last - first, SamplingParams(args.temperature), gamma,
                                   args.max_new_tokens, start=first, on_domain=progress, samples=args.samples,
                                   prompts_file=args.prompts)  # fmt: skip
    conf, events, mask = rounds.calibration_arrays()
    temps, reasons = calibration.select_sts(conf, events, mask, shifts=args.shifts)
    rows = calibration.position_metrics(conf, events, mask, temps)
    temps, reasons = padded_sts(temps, reasons, drafter.max_gamma)
    info = {"rounds": int(conf.shape[0]), "gamma": gamma, "temperature": args.temperature,
            "prompts": f"eval prompts {first}..{last - 1} of each domain of {prompts_label(args.prompts)}, "
                       f"{args.samples} sample(s) each",
            "selection": "fitted on even rounds, kept where odd rounds' ECE improves", "reasons": reasons,
            "checkpoint": str(path), "checkpoint_sha256": checkpoint_digest(path)}  # fmt: skip
    written = calibration.save_temperatures(out, temps, info)
    print(
        "\n| k | T_k | b_k | why | ECE before | ECE after (in-sample) | AUROC |\n|---:|---:|---:|---|---:|---:|---:|"
    )
    for t, b, r, why in zip(*(x.tolist() for x in temperatures_and_offsets(temps)), rows, reasons):
        auc = "-" if r["auroc"] is None else f"{r['auroc']:.3f}"
        print(f"| {r['k']} | {t:.3f} | {b:+.3f} | {why} | {100 * r['ece_before']:.1f}% | "
              f"{100 * r['ece_after']:.1f}% | {auc} |")  # fmt: skip
    print(f"\nstored the STS temperatures{' and logit offsets' * args.shifts} in {written}")
    home = calibration_path(path, target_name)
    if args.ship and home.is_file():
        print(f"note: {home} (an earlier calibration under DSPARK_HOME) is still read first; delete it to use the "
              "shipped one")  # fmt: skip
