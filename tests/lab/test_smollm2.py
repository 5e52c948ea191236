"""The real pretrained target, SmolLM2-135M-Instruct (fetched once into DSPARK_HOME; `.ci/run` fetches it
before the tests): it answers a known question, and speculative decoding with every drafter kind is
token-identical to plain greedy decoding in fp32 on unseen prompts: three written for this test and the first
held-out ("eval" split, never trained on) self-written request of each domain.

Drafters: the ones shipped for smollm2-135m where they exist, else freshly initialised ones (their drafts are
mostly rejected, which tests the rejection/rollback path hardest; losslessness does not depend on quality)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark.decoding import generate
from dspark.drafters import DRAFTER_NAMES, default_path
from dspark.engine import speculative_generate
from dspark.lab.data.prompt_files import read_prompts
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.pretrained import load_pretrained
from dspark.lab.training.drafters import new_drafter
from dspark.sampling import SamplingParams

PROMPTS = [
    "Name three primary colors.",
    "What is 17 + 25?",
    "Write a Python function that returns the square of x.",
]
INSTRUCTIONS = Path(__file__).resolve().parents[2] / "walkthrough/data/smollm2-135m/instructions.jsonl.gz"


def held_out_prompts() -> list[str]:
    """The first eval-split request per domain (chat, code, math) of the committed self-written instructions."""
    first: dict[str, str] = {}
    for record in read_prompts(INSTRUCTIONS, split="eval"):
        first.setdefault(record.domain, record.prompt)
    assert sorted(first) == ["chat", "code", "math"]
    return list(first.values())


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return load_pretrained("smollm2-135m", torch.float32, max_seq_len=256, quiet=True)


def test_known_answer(smollm2):
    tok = smollm2.tokenizer
    assert smollm2.name == "smollm2-135m" and smollm2.model.config.n_layers == 30
    out = generate(smollm2.model, [tok.chat_prompt("What is the capital of France?")], 16, SamplingParams(0.0),
                   torch.Generator().manual_seed(0), eos_id=tok.eos_id)  # fmt: skip
    assert "Paris" in tok.decode(out.tokens[0])


@pytest.mark.parametrize("kind", [n for n in DRAFTER_NAMES if n != "none"])
def test_fp32_greedy_identity(smollm2, kind):
    model, tok = smollm2.model, smollm2.tokenizer
    prompts = [tok.chat_prompt(p) for p in PROMPTS + held_out_prompts()]
    if default_path(kind, smollm2.name).is_file():
        drafter = get_drafter(kind, model, target_name=smollm2.name)
    else:
        torch.manual_seed(1)
        drafter = new_drafter(model, kind, gamma=4).eval()
    gamma = 1 if kind == "mtp" else 4
    params = SamplingParams(0.0)
    plain = generate(model, prompts, 32, params, torch.Generator().manual_seed(0), eos_id=tok.eos_id)
    spec = speculative_generate(model, drafter, prompts, 32, params, gamma, torch.Generator().manual_seed(0),
                                tok.eos_id)  # fmt: skip
    assert spec.tokens == plain.tokens


def test_serve_uses_the_drafters_shipped_for_the_target(smollm2, tmp_path, monkeypatch):
    """`bench serve --model smollm2-135m`: the engine runs the drafter shipped for SmolLM2 (the tiny target's
    would not even load), with its calibration; traces of a named target are cached apart from the tiny one's."""
    from dspark.lab.study import pareto
    from dspark.scheduler import ThroughputProfile

    monkeypatch.setenv("DSPARK_HOME", str(tmp_path))
    assert pareto.trace_path("dspark", 1.0, "smollm2-135m") != pareto.trace_path("dspark", 1.0)
    profile = ThroughputProfile([40.0 - i for i in range(16)], "synthetic")
    points = pareto.serve_points(smollm2.model, smollm2.tokenizer, ["none", "dspark"], [2], 2, 6, profile,
                                 SamplingParams(0.0), cost_aware=False, target_name=smollm2.name)  # fmt: skip
    assert [(p["policy"], p["drafter"], p["completed"]) for p in points] == [
        ("none", "none", 2),
        ("dspark", "dspark", 2),
    ]
    assert points[0]["tau"] == 1.0 and points[1]["mean_verify_len"] > 0
