"""The bodies of `python -m dspark.bench`'s commands (the parser is dspark/lab/commands/bench.py): paper.py
for the paper's quality claims, speed.py for timings, common.py for what they share."""
