"""`python -m dspark.export`: the exporter; the command lives in dspark/lab/commands/export.py."""

import sys

import dspark.lab.interrupt  # noqa: F401 (first: Ctrl-C during the imports below is one line)
from dspark.lab.cli import run_main
from dspark.lab.commands.export import main

if __name__ == "__main__":
    sys.exit(run_main(main))
