"""The data layer: the offline corpus and its splits (corpus.py), the byte-level BPE tokenizer and chat
format (tokenizer.py), the math word-problem generator (math_problems.py). Imports nothing of the model.
"""
