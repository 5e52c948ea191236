"""Data the lab builds and reads: the offline corpus and its splits (corpus.py), the math word-problem generator
(math_problems.py with math_words.py, math_money.py, math_quantities.py), which self-written requests to keep
(instructions.py) and a user's prompts file (prompt_files.py). The tokenizer is the core's (dspark/tokenizer.py).
"""
