"""The byte-level BPE tokenizer and chat format (tokenizer.py). The corpus, the math generator and prompts files
live in dspark/lab/data/.
"""
