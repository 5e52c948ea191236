"""`python -m dspark.fetch`: fetching named models; the command lives in dspark/lab/commands/fetch.py."""

import sys

from dspark.lab.cli import run_main
from dspark.lab.commands.fetch import main

if __name__ == "__main__":
    sys.exit(run_main(main))
