"""The instructor's solutions: each module implements one assignment's starter signatures
by calling the project's own code (`python -m dspark.grade N --reference` grades it)."""
