"""Survival and scheduling: verify-length policies and Algorithm 1 (scheduler.py), STS calibration and its
metrics (calibration.py), the SPS(B) throughput profiles (profiler.py).
"""
