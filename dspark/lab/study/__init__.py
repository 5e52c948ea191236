"""Benchmarks and studies: the offline study (offline.py), the serving frontier (pareto.py), the trace-
driven simulator (simulator.py), Appendix A (counterexample.py), kernel timings (kernels.py), chi-square
helpers (stats.py) and every figure (plots.py).
"""
