"""Graders for the course assignments in walkthrough/assignments/ (`python -m dspark.grade N`).

`framework.py` runs checks on a student's file (each in its own process, with a time
limit) and reports them, from parts its docstring maps (`checks.py`, `expect.py`,
`check_process.py`, `sandbox.py`, `plain_data.py`, `reference_guard.py`); `catalog.py`
lists the assignments; `a1_verification.py`, `a2_round.py` (with its test doubles in
`a2_fixtures.py`), `a3_markov.py`, `a4_survival.py` and `a5_scheduling.py` hold each
assignment's checks; `reference/` holds the instructor's solutions: the starters'
signatures implemented with the project's own code; `command.py` is the command itself
(dspark/grade.py runs it). walkthrough/assignments/INSTRUCTORS.md says how the graders are
validated (tests/course/test_grading.py, planted bugs in tests/course/assignments/).

What each hand-made piece is for, and why no library replaces it (issue #60; measured on this
project's 2-core CPU, the experiments' numbers in the commit that wrote this). Issue #41 asks that
a forged verdict, patched comparison helpers and NaN answers score 0, that a check which loops or
crashes loses that check only, and that nothing is left running.

* framework.py + checks.py (the runner and the report, 435 lines): the checks run in the grader
  and only the student's calls cross to another process. pytest-forked runs the whole test,
  comparisons included, in the forked child and reports from there: a solution that replaces the
  comparison helper at import got "2 passed" for a wrong answer, and a `sleep` it started with
  setsid() outlived the run. Otter-grader, gradescope-utils and nbgrader likewise judge in the
  process (or kernel) that ran the student's code and leave integrity to a container.
* check_process.py (deadline on every wait, replies checked, kill by pidfd): pytest-timeout's
  signal method is a SIGALRM in the student's process: a solution that ignores SIGALRM hung the
  run until an outer `timeout` killed it; its thread method os._exit()s the whole run (the next
  checks are lost), and with --forked it fires in the parent: the run ended and the looping child
  was left running. multiprocessing.connection's recv() unpickles anything (code run in the
  grader) and recv_bytes() has no deadline once a message has begun.
* sandbox.py (supervisor, scratch folder, subreaper, freeze-then-kill sweep): the process tree is
  now listed with psutil (it replaced a hand-written /proc parser; a sweep of 267 sleepers took
  572 ms against 710 ms); no library makes a process the child subreaper (python-prctl, last
  released 2020, needs a C build; here it is 3 lines of ctypes) or stops a tree before killing
  it so that nothing is orphaned meanwhile. Forking costs ~30 ms a check (two forks, the import,
  one call, the sweep; pytest-forked's one fork ~14 ms); a fresh interpreter per check (execnet,
  multiprocessing's spawn, pytest-isolate) would cost ~1.5 s a check to start Python and torch.
* plain_data.py (what crosses the pipes): an unpickler that loads no class at all. The first
  version (#41) read replies with torch.load(weights_only=True); its allowlist of torch classes is
  a larger surface (it had a code-execution bug, CVE-2025-32434, fixed in torch 2.6).
* reference_guard.py (copies of the reference, its import or reading): exact token equality with
  Python's tokenize, an import hook and an audit hook, all standard library. Similarity tools
  (copydetect, MOSS) score with a threshold and would flag the renamed-variable copy that
  tests/course/test_grading_limits.py pins at full marks: a changed verdict.
* expect.py: one-line messages that show the got and expected values and a hint, and refuse NaN
  and inf; torch.testing.assert_close writes several lines and counts inf equal to inf.
"""
