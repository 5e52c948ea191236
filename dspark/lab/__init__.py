"""The lab: what reproduces the paper's numbers, reaches outside or measures, built on the core.

`data/` (the offline corpus, the math generator, prompts files), `training/` (the training pipelines and the
feature cache), `pretrained/` (a real Llama target: GGUF, Hugging Face folders, named models fetched with pip),
`step_cost.py` (a drafting step's measured cost), `study/` (the offline study, the serving frontier, the
simulator, Appendix A, tables and plots), `benchmarks/` (the bodies of `python -m dspark.bench`), `exporting/`
(a drafter as a folder the serving engines load), `train_commands/` (the bodies of `python -m dspark.train`),
`commands/` (the `bench`, `train`, `export` and `fetch` commands themselves, run by dspark/<name>.py) and
`cli.py` (the options the commands share, and their one-line errors).
The lab imports the core; the core never imports the lab (tests/lab/test_architecture.py checks it).
"""
