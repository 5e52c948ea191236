"""The course graders (dspark/grading/, `python -m dspark.grade`) are trustworthy in both directions.

* The untouched starters score 0, every check saying "not implemented", no traceback.
* The instructor's reference solutions (the project's own code) and independent
  from-scratch solutions (tests/assignments/aN_solution.py) score full marks.
* Every planted bug (tests/assignments/aN_*.py, one realistic bug each) fails the check
  named for it, with a reason, not a crash.
* A crashing and a hanging solution are reported per check; the grader still exits 0
  with `score: X/Y` as its last line, and leaves no process behind.
* The command line: --list, --reference, --check, a bad number, a missing file, a file
  that does not import: one line on stderr, a non-zero status, no traceback.

Gradings run in this process (each check in a forked child), planted bugs on their
named checks only, so the file stays well under a minute on 2 cores.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from dspark import grade as grade_command
from dspark.cli import run_main
from dspark.grading.catalog import ASSIGNMENTS
from dspark.grading.framework import grade

SOLUTIONS = Path(__file__).resolve().parent / "assignments"
NUMBERS = sorted(ASSIGNMENTS)

# (file in tests/assignments, assignment, the checks that must catch its bug)
PLANTED_BUGS = [
    ("a1_residual_not_normalised.py", 1, ["residual_is_normalised"]),
    ("a1_bonus_from_last_row.py", 1, ["verify_lengths_0_1_gamma_minus_1_gamma"]),
    (
        "a1_reused_uniforms.py",
        1,
        ["same_as_reference_for_the_same_uniforms", "first_token_follows_the_target"],
    ),  # fmt: skip
    ("a1_ignores_verify_lens.py", 1, ["verify_lengths_0_1_gamma_minus_1_gamma"]),
    ("a1_target_row_off_by_one.py", 1, ["hand_worked_accept_then_reject"]),
    ("a2_rollback_drops_anchor.py", 2, ["cache_holds_exactly_the_committed_tokens"]),
    ("a2_eos_only_at_block_end.py", 2, ["emit_stops_at_eos_and_the_limit", "eos_inside_a_block"]),
    (
        "a2_limit_checked_per_block.py",
        2,
        ["emit_stops_at_eos_and_the_limit", "max_new_tokens_inside_a_block"],
    ),  # fmt: skip
    ("a2_drafter_sees_rejected_drafts.py", 2, ["drafter_gets_exactly_the_committed_tokens"]),
    ("a2_pass_per_request.py", 2, ["one_target_pass_per_round"]),
    ("a3_confidence_reads_new_token.py", 3, ["confidence_matches_reference"]),
    ("a3_markov_reads_current_token.py", 3, ["block_tokens_and_q_match_reference"]),
    ("a3_temperature_after_softmax.py", 3, ["draft_probs_at_a_temperature"]),
    ("a3_block_sees_its_anchor.py", 3, ["visibility_hand_worked"]),
    ("a3_greedy_by_tiny_temperature.py", 3, ["greedy_ties_go_to_the_lowest_id"]),
    ("a4_ece_unweighted.py", 4, ["ece_weights_bins_by_size"]),
    ("a4_sts_independent.py", 4, ["sts_matches_the_reference_search"]),
    ("a4_temperature_on_probability.py", 4, ["calibrated_survival_values_and_order"]),
    ("a4_auroc_ties_lost.py", 4, ["auroc_ties_count_half"]),
    ("a4_events_from_verify_len.py", 4, ["events_and_mask_hand_worked"]),
    ("a5_no_early_stop.py", 5, ["early_stop_halts_at_the_first_drop", "appendix_a_algorithm_1_is_lossless"]),
    ("a5_ties_by_request.py", 5, ["greedy_path_ties_go_to_the_earlier_position"]),
    ("a5_admits_equal_theta.py", 5, ["strict_improvement_only"]),
    ("a5_tau_without_bonus.py", 5, ["theta_along_the_path_appendix_a"]),
]


def cli(capsys, *argv: str) -> tuple[int, list[str], str]:
    """(exit status, stdout lines, stderr) of `python -m dspark.grade ARGV`, run in this process."""
    status = run_main(grade_command.main, list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, [line.strip() for line in out.splitlines() if line.strip()], err


@pytest.mark.parametrize("number", NUMBERS)
def test_untouched_starter_scores_zero_and_says_not_implemented(number, capsys):
    status, lines, _ = cli(capsys, str(number))
    assignment = ASSIGNMENTS[number]
    assert status == 0 and lines[-1] == f"score: 0/{assignment.points}"
    check_lines = lines[1:-1]
    assert len(check_lines) == len(assignment.checks)
    for line, check in zip(check_lines, assignment.checks):
        assert line.startswith("FAIL") and f" {check.name}: not implemented" in line, line


@pytest.mark.parametrize("number", NUMBERS)
def test_reference_solution_scores_full_marks(number):
    assignment = ASSIGNMENTS[number]
    report = grade(assignment, assignment.reference_path)
    failures = [r.line() for r in report.results if not r.passed]
    assert report.score == report.total == assignment.points, failures


@pytest.mark.parametrize("number", NUMBERS)
def test_independent_solution_scores_full_marks(number):
    path = next(SOLUTIONS.glob(f"a{number}_solution.py"))
    report = grade(ASSIGNMENTS[number], path)
    assert report.score == report.total, [r.line() for r in report.results if not r.passed]


@pytest.mark.parametrize("file, number, caught_by", PLANTED_BUGS, ids=[b[0] for b in PLANTED_BUGS])
def test_planted_bug_fails_its_named_check(file, number, caught_by):
    report = grade(ASSIGNMENTS[number], SOLUTIONS / file, only=caught_by)
    assert [r.name for r in report.results] == caught_by
    for result in report.results:
        assert not result.passed, f"{file}: {result.name} did not catch the bug"
        assert result.detail and not result.detail.startswith(("crashed", "timed out", "not implemented"))


def test_every_planted_bug_is_tested():
    files = {p.name for p in SOLUTIONS.glob("a*_*.py") if not p.name.endswith("_solution.py")}
    assert files == {b[0] for b in PLANTED_BUGS}
    assert all(sum(b[1] == n for b in PLANTED_BUGS) >= 3 for n in NUMBERS)  # at least three per assignment


def test_a_crashing_solution_is_reported_per_check(capsys):
    status, lines, _ = cli(capsys, "5", str(SOLUTIONS / "crashing.py"))
    assert status == 0 and lines[-1] == f"score: 0/{ASSIGNMENTS[5].points}"
    check_lines = lines[1:-1]
    assert len(check_lines) == len(ASSIGNMENTS[5].checks)
    assert all(": crashed: " in line for line in check_lines)
    by_name = {line.split()[2].rstrip(":"): line for line in check_lines}
    assert "IndexError" in by_name["survival_is_the_cumulative_product"]
    assert "crashing.py:" in by_name["survival_is_the_cumulative_product"]  # where, in the student's file
    assert "ZeroDivisionError" in by_name["greedy_path_order"]
    assert "in greedy_path)" in by_name["greedy_path_order"]
    # os._exit(3): the process died without a verdict, and the check still has its line
    assert "exit status 3" in by_name["theta_along_the_path_appendix_a"]
    assert not multiprocessing.active_children()


def test_a_hanging_solution_times_out_on_that_check_only(capsys):
    status, lines, _ = cli(capsys, "5", str(SOLUTIONS / "hanging.py"), "--timeout", "1")
    assert status == 0 and lines[-1] == f"score: {ASSIGNMENTS[5].points - 1}/{ASSIGNMENTS[5].points}"
    assert "survival_is_the_cumulative_product: timed out after 1s" in lines[1]
    assert all(line.startswith("PASS") for line in lines[2:-1])
    assert not multiprocessing.active_children()  # the hanging child was killed


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        grade_command.main(["--help"])
    assert exit_info.value.code == 0 and "usage: python -m dspark.grade" in capsys.readouterr().out


def test_cli_list_reference_and_single_check(capsys):
    status, lines, _ = cli(capsys, "--list")
    assert status == 0 and lines == [f"{n}  {ASSIGNMENTS[n].title}" for n in NUMBERS]
    status, lines, _ = cli(capsys, "5", "--reference", "--check", "greedy_path_order")
    assert status == 0 and lines[1].startswith("PASS") and "greedy_path_order" in lines[1]
    assert lines[-1] == "score: 2/2" and len(lines) == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["7"], "there is no assignment 7"),
        (["one"], "must be a number"),
        ([], "which assignment"),
        (["1", "no/such/solution.py"], "no solution file"),
        (["1", "--reference", "x.py"], "not both"),
        (["5", "--check", "no_such_check"], "has no check no_such_check"),
        (["1", "--timeout", "soon"], "invalid float value"),
    ],
)
def test_cli_usage_errors_are_one_line(capsys, argv, message):
    status, lines, err = cli(capsys, *argv)
    assert status != 0 and not lines
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.parametrize(
    "source, message",
    [
        ("def verify(:\n", "SyntaxError"),
        ("import no_such_module_anywhere\n", "ModuleNotFoundError"),
        ("while True:\n    pass\n", "timed out after 0.5s"),
    ],
)
def test_a_file_that_does_not_import_is_one_line(tmp_path, capsys, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    status, lines, err = cli(capsys, "1", str(path), "--timeout", "0.5")
    assert status != 0 and not lines
    assert len(err.strip().splitlines()) == 1 and "cannot import broken.py" in err and message in err
