"""Drafters: the contract (base.py: propose -> Proposal), MTP-1 and EAGLE-3 (autoregressive.py), DFlash and
DSpark (parallel.py), building them by name (registry.py).
"""
