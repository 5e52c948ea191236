"""Training: the target (target.py), target-regenerated drafter data (responses.py), drafter training with
soft labels and training-time test (drafters.py), DSpark's packed-block loss (packed_blocks.py).
"""
