"""`python -m dspark.grade`: the course's grader; the command lives in dspark/course/command.py."""

import sys

from dspark.course.command import main
from dspark.lab.cli import run_main

if __name__ == "__main__":
    sys.exit(run_main(main))
