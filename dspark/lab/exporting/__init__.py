"""Exporting a drafter trained here into the folders the serving engines load (`python -m dspark.export`).

fields.py (what every layout shares: the layer config, the refusals, the README's facts), one module per
layout -- deepspec.py (DeepSpec's Qwen3DSparkModel: vLLM / SGLang / llama.cpp DSpark and DFlash),
speculators.py (vLLM's speculators format, which llama.cpp also reads), eagle3.py (EAGLE-3 for Llama
targets) -- and folder.py (writing a folder atomically). The tensors' names are the drafters' own business
(dspark/lab/exporting/hf_layout.py), and so is reading a folder back (dspark/lab/exporting/exported.py).
"""
