"""The bodies of `python -m dspark.train`'s commands (the parser is dspark/lab/commands/train.py), in the
order they run: pretraining.py (data, target), drafter_data.py (instructions, responses, features),
drafter.py, calibrate.py."""
