"""`python -m dspark.train`: the training commands; the command lives in dspark/lab/commands/train.py."""

import sys

from dspark.lab.cli import run_main
from dspark.lab.commands.train import main

if __name__ == "__main__":
    sys.exit(run_main(main))
