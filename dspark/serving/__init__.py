"""Serving: requests, their records and the rounds' statistics (requests.py), the continuous-batching engine
(engine.py) and batch speculative generation on it (speculative.py).
"""
