"""The `python -m dspark.bench`, `train`, `export` and `fetch` commands; dspark/<name>.py runs each."""
