"""Serving: the statistics of speculative rounds (rounds.py), the continuous-batching engine (engine.py) and
batch speculative generation on it (speculative.py).
"""
