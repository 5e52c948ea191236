"""`python -m dspark.bench`: the benchmarks; the command lives in dspark/lab/commands/bench.py."""

import sys

import dspark.lab.interrupt  # noqa: F401 (first: Ctrl-C during the imports below is one line)
from dspark.lab.cli import run_main
from dspark.lab.commands.bench import main

if __name__ == "__main__":
    sys.exit(run_main(main))
