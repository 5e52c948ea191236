"""Training pipelines: the tiny target (target.py), self-written instructions (instructions.py), target-regenerated
drafter data (responses.py), the feature cache (feature_cache.py), anchors (anchors.py) and the drafter training loop
(drafters.py). The loss they minimise is the core's (dspark/training.py).
"""
