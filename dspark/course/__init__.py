"""Graders for the course assignments in walkthrough/assignments/ (`python -m dspark.grade N`).

`framework.py` runs checks on a student's file (each in its own process, with a time
limit) and reports them, from parts its docstring maps (`checks.py`, `expect.py`,
`check_process.py`, `sandbox.py`, `plain_data.py`, `reference_guard.py`); `catalog.py`
lists the assignments; `a1_verification.py`, `a2_round.py` (with its test doubles in
`a2_fixtures.py`), `a3_markov.py`, `a4_survival.py` and `a5_scheduling.py` hold each
assignment's checks; `reference/` holds the instructor's solutions: the starters'
signatures implemented with the project's own code; `command.py` is the command itself
(dspark/grade.py runs it). walkthrough/assignments/INSTRUCTORS.md says how the graders are
validated (tests/test_grading.py, planted bugs in tests/assignments/).
"""
