"""`python -m dspark.generate`: talk to the shipped model; the command lives in dspark/lab/commands/generate.py."""

import sys

import dspark.lab.interrupt  # noqa: F401 (first: Ctrl-C during the imports below is one line)
from dspark.lab.cli import run_main
from dspark.lab.commands.generate import main

if __name__ == "__main__":
    sys.exit(run_main(main))
