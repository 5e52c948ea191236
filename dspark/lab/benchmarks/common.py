"""What every benchmark command shares: loading the target, the held-out prompts, writing --out tables."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dspark.lab import cli, storage
from dspark.lab.study import offline, pareto, plots
from dspark.model import Transformer
from dspark.scheduler import make_policy
from dspark.tokenizer import Tokenizer


def load_model(args: argparse.Namespace, device: torch.device | None = None) -> tuple[Tokenizer, Transformer]:
    """The tokenizer and the target (--checkpoint, or --model in --dtype), moved to --device (or `device`);
    the target's name (for its shipped drafters) goes into `args.target_name`."""
    tokenizer, target, args.target_name = cli.load_target(args, device or cli.device_of(args))
    return tokenizer, target


def study_prompts(args: argparse.Namespace, tokenizer: Tokenizer, target: Transformer) -> dict:
    """--prompts-per-domain held-out prompts of each domain (token ids) that fit the target's context."""
    return offline.prompts_by_domain(tokenizer, args.prompts_per_domain, 0, target.config.max_seq_len,
                                     getattr(args, "prompts", None))  # fmt: skip


def write_outputs(args: argparse.Namespace, stem: str, table: str, plot) -> None:
    """With --out DIR: DIR/<stem>.md holds `table`; `plot(DIR)` draws the figure(s) there."""
    if not args.out:
        return
    out = Path(args.out)
    storage.write_text_atomic(out / f"{stem}.md", table)
    plot(out)
    print(f"wrote {out / stem}.md and its figure(s)")


def dtype_name(target: Transformer) -> str:
    """The target's weight dtype, as the --dtype option spells it."""
    return str(target.embed.weight.dtype).removeprefix("torch.")


def policy_for(policy: str, drafter) -> str:
    """`policy` for a drafter it can run with; `fixed` for one without the confidences it ranks by."""
    return "fixed" if make_policy(policy).needs_confidence and not drafter.has_confidence else policy


def report_points(points: list[dict], args: argparse.Namespace, title: str, stem: str) -> None:
    report = pareto.frontier_report(points, args.policies)
    print(f"{title}\n\n{report}")

    def plot(out: Path) -> None:
        plots.plot_frontier(points, out / f"{stem}_frontier.png", title)
        plots.plot_load(points, out / f"{stem}_load.png", title)

    write_outputs(args, stem, report, plot)
