"""`python -m dspark.grade`: the course's grader; the command lives in dspark/course/command.py."""

import sys

import dspark.lab.interrupt  # noqa: F401 (first: Ctrl-C during the imports below is one line)
from dspark.course.command import main
from dspark.lab.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main(main))
