"""How a drafter learns (the core's part): the training batch of target features (features.py), DSpark's
packed-block loss (packed_blocks.py) and the distribution loss with its hand-written gradient
(distribution_loss.py). The pipelines around them live in dspark/lab/training/.
"""
