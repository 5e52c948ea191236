"""Shared command-line plumbing: the options the commands share, and clean errors instead of tracebacks.

Every `python -m dspark.<command>` entry point runs through `run_main`. Errors
a user can cause (bad arguments, missing or corrupt files, prompts that do not
fit) are raised as `UsageError`, `CheckpointError`, `FileNotFoundError` or
`ValueError` deep inside the library and printed here as one line on stderr
with a non-zero exit status (2, or the `UsageError`'s own). Ctrl-C exits
quietly with status 130.

An option that more than one command takes is declared here, once, by a small
function that adds its group to a parser: `add_threads`, `add_target`,
`add_drafter` / `add_gamma`, `add_sampling` / `add_seed`, `add_outputs`. So it
has the same name, type, default and help in `generate`, every `train` and
every `bench` subcommand; a command declares in place only what is its own.
Defaults come from the config dataclasses where one holds them (γ from
`ParallelDrafterConfig`). `--threads` defaults to 0 everywhere, which leaves
torch's own default: one thread per physical core (or $OMP_NUM_THREADS), so
training and benchmarks use every core unless told otherwise; `apply_threads`
applies it. The rest is small plumbing for the same commands: `add_option` (a
typed option whose help shows its default), `add_command` (a subcommand whose
description is its handler's docstring), `command_parser`, the comma-separated
list types and `at_least_one`.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Sequence

import torch

from dspark import paths
from dspark.checkpoint import CheckpointError
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.drafters.registry import DRAFTER_NAMES


class UsageError(Exception):
    """The user asked for something that cannot be done; the message says why.

    `status` is the exit status (2: a bad request; 1: this machine cannot do it)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    try:
        return main(argv) or 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# ---- shared options -----------------------------------------------------------------------------------
def add_option(parser: argparse.ArgumentParser, flag: str, default, help: str, **kwargs) -> None:
    """An option of its default's type whose help ends with the default."""
    kwargs.setdefault("type", type(default))
    parser.add_argument(flag, default=default, help=f"{help} (default: %(default)s)", **kwargs)


def add_threads(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--threads", 0, "torch CPU threads, 0 = torch's default: one per physical core")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's thread count if the command has --threads and it is not 0."""
    threads = getattr(args, "threads", 0)
    if threads < 0:
        raise UsageError(f"--threads must be at least 0 (0 = torch's default), got {threads}")
    if threads:
        torch.set_num_threads(threads)


def add_target(parser: argparse.ArgumentParser, tokenizer: bool = False) -> None:
    """--checkpoint of the target model (and --tokenizer)."""
    parser.add_argument("--checkpoint", default=str(paths.TARGET_CHECKPOINT),
                        help="target model weights (default: the shipped model)")  # fmt: skip
    if tokenizer:
        parser.add_argument("--tokenizer", default=str(paths.TOKENIZER_PATH),
                            help="tokenizer.json (default: the shipped one)")  # fmt: skip


def add_gamma(parser: argparse.ArgumentParser, help: str = "draft tokens per round") -> None:
    add_option(parser, "--gamma", ParallelDrafterConfig().gamma, help)


def add_drafter(
    parser: argparse.ArgumentParser,
    names: Sequence[str] | None = DRAFTER_NAMES,
    default: str = "dspark",
    help: str = "drafter name",
    checkpoint: bool = True,
    gamma_help: str = "draft tokens per round",
) -> None:
    """--drafter (one of `names`; None: free text), --drafter-checkpoint (unless `checkpoint` is False), --gamma."""
    add_option(parser, "--drafter", default, help, choices=names)
    if checkpoint:
        parser.add_argument("--drafter-checkpoint", help="drafter weights (default: the shipped one)")
    add_gamma(parser, gamma_help)


def add_seed(parser: argparse.ArgumentParser, default: int = 0, help: str = "random seed") -> None:
    add_option(parser, "--seed", default, help)


def add_sampling(
    parser: argparse.ArgumentParser,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top: bool = False,
    seed: int | None = None,
    tokens_help: str = "tokens per request",
) -> None:
    """The sampling options a command takes: each is added when given a default (--top-k/--top-p with `top`)."""
    if max_new_tokens is not None:
        add_option(parser, "--max-new-tokens", max_new_tokens, tokens_help)
    if temperature is not None:
        add_option(parser, "--temperature", float(temperature), "sampling temperature, 0 = greedy")
    if top:
        add_option(parser, "--top-k", 0, "sample only from the k best tokens, 0 = off")
        add_option(parser, "--top-p", 1.0, "nucleus sampling mass, 1 = off")
    if seed is not None:
        add_seed(parser, seed, "random seed for sampling")


def add_outputs(
    parser: argparse.ArgumentParser,
    out: str | None = None,
    out_default: str | None = None,
    out_metavar: str = "DIR",
    json: str | None = "file",
) -> None:
    """--out (`out` is its help; None: no --out) and --json: "file" = --json PATH, "stdout" = a flag."""
    if out is not None:
        parser.add_argument("--out", default=out_default, metavar=out_metavar, help=out)
    if json == "file":
        parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    elif json == "stdout":
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def at_least_one(args: argparse.Namespace, *dests: str) -> None:
    """UsageError unless each of these options (where the command has it and it is set) is >= 1."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and value < 1:
            raise UsageError(f"--{dest.replace('_', '-')} must be at least 1, got {value}")


# ---- argument types -------------------------------------------------------------------------------------
def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def parse_name_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def add_command(
    subparsers, name: str, func: Callable, help: str, threads: bool = False
) -> argparse.ArgumentParser:
    """A subcommand that runs `func(args)`; `func`'s docstring is its description (with `threads`: --threads)."""
    parser = subparsers.add_parser(name, help=help, description=inspect.getdoc(func) or help)
    parser.set_defaults(func=func)
    if threads:
        add_threads(parser)
    return parser


def command_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A command's top-level parser: its module docstring as the description, line breaks kept."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
