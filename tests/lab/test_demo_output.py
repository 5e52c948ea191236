"""`python -m dspark.generate --json` keeps printing the same greedy demo replies.

tests/data/demo_greedy.json holds what the demo printed at temperature 0 before
the package was reorganised (the same text for every drafter: verification is
lossless). Plain decoding, the default DSpark drafter and DSpark with the
confidence-scheduled prefix policy must all still print exactly that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark import generate

PINNED = json.loads((Path(__file__).parents[1] / "data" / "demo_greedy.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "args",
    [["--drafter", "none"], ["--drafter", "dspark"], ["--drafter", "dspark", "--policy", "fixed"]],
    ids=["none", "dspark-default-policy", "dspark-policy-fixed"],
)
def test_greedy_demo_output_is_pinned(args, capsys):
    generate.main(["--json", *args])
    record = json.loads(capsys.readouterr().out)
    assert record["temperature"] == 0.0
    assert record["prompts"] == PINNED["prompts"], (
        "the demo prompts changed (dspark/assets/eval_prompts.jsonl)"
    )
    assert record["text"] == PINNED["text"]
    assert record["new_tokens"] == PINNED["new_tokens"]
    assert record["stop_reasons"] == PINNED["stop_reasons"]
