"""dspark/device.py and device-awareness: every hot path makes its tensors on its inputs' device.

Run inside `with torch.device("meta")` (the engine, plain and speculative decoding, every drafter's `propose`, the
scheduler, verify and calibration) with CPU models and inputs: a tensor factory without an explicit device makes a
meta tensor and the run fails; device-aware code gives the same output as outside the context. A static `ast` scan
of the hot paths backs it up (the host reads per step are counted by the lab: tests/lab/test_host_reads.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from helpers import make, make_drafter, on_meta, prompts

from dspark.decoding import generate
from dspark.drafters.base import NoDrafter, TargetFeatures
from dspark.engine import Engine, Request, speculative_generate
from dspark.lab import calibration
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.scheduler import (
    POLICY_NAMES,
    Scheduler,
    ThroughputProfile,
    expected_rate,
    greedy_path,
    make_policy,
    prefix_schedule,
    prefix_survival,
)
from dspark.verify import draw_uniforms, verify

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ThroughputProfile([1 / (1.0 + 0.05 * B) for B in range(1, 257)])
TEMPERATURES = torch.tensor(
    [1.1, 0.9, 1.0, 0.5], dtype=torch.float64
)  # STS, on the CPU like the shipped ones
PARAMS = {"greedy": SamplingParams(0.0), "sampled": SamplingParams(1.0), "top": SamplingParams(0.8, 20, 0.9)}
DRAFTERS = ["none", "mtp", "eagle", "dflash", "dspark", "dspark-rnn"]


def build(kind: str, target, gamma: int = 4):
    if kind in ("dflash", "dspark", "dspark-rnn"):
        return make(target, kind, gamma=gamma)
    return make_drafter(kind, target, gamma).eval()


def gamma_of(kind: str) -> int:
    return {"none": 0, "mtp": 1}.get(kind, 4)


def plain(x):
    """Tensors -> (device type, nested lists), recursively, so results compare with ==."""
    if isinstance(x, torch.Tensor):
        return (x.device.type, x.tolist())
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


# ---- whole paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(PARAMS))
def test_plain_decoding(tiny_model, mode):
    ps = prompts([3, 9, 1, 30], seed=1)

    def run():
        r = generate(tiny_model, ps, 12, PARAMS[mode], torch.Generator().manual_seed(7), eos_id=5)
        return r.tokens, r.stop_reasons

    expected, got = on_meta(run)
    assert got == expected


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("kind", DRAFTERS)
def test_speculative_generate_every_drafter(tiny_model, kind, mode):
    drafter = build(kind, tiny_model)
    ps = prompts([3, 17, 1, 50], seed=2)  # the last one hits the 64-token context inside a block

    def run():
        r = speculative_generate(tiny_model, drafter, ps, 14, PARAMS[mode], gamma_of(kind),
                                 torch.Generator().manual_seed(3), eos_id=7)  # fmt: skip
        return r.tokens, r.from_draft, r.stats.verify_lens, r.stats.accepted, r.stats.confidences

    expected, got = on_meta(run)
    assert got == expected
    if mode == "greedy":
        assert expected[0] == generate(tiny_model, ps, 14, PARAMS[mode], eos_id=7).tokens


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_engine_every_policy_with_slot_reuse(tiny_model, policy):
    drafter = build("dspark", tiny_model)
    ps = prompts([4, 11, 2, 25, 7], seed=4)

    def run():
        scheduler = Scheduler.for_drafter(make_policy(policy, threshold=0.3), drafter, PROFILE,
                                                TEMPERATURES)  # fmt: skip
        engine = Engine(tiny_model, drafter, PARAMS["sampled"], 4, 2, None, scheduler)
        result = engine.run([Request(p, 10) for p in ps], torch.Generator().manual_seed(5))
        recs = result.records
        return [(r.tokens, r.rounds, r.stop_reason) for r in recs]

    expected, got = on_meta(run)
    assert got == expected


# ---- the pieces, one by one -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", DRAFTERS[1:])
@pytest.mark.parametrize("mode", list(PARAMS))
def test_every_drafter_propose(tiny_model, kind, mode):
    drafter = build(kind, tiny_model)
    ps = prompts([5, 2, 9], seed=6)
    gamma = gamma_of(kind)

    def run():
        cache = tiny_model.new_cache(3)
        drafter.reset(cache.n_slots)
        slots = torch.tensor([cache.allocate() for _ in ps], device="cpu")
        lens = torch.tensor([len(p) for p in ps], device="cpu")
        flat = torch.tensor([t for p in ps for t in p], device="cpu")
        res = tiny_model.forward_cached(flat, slots, lens, cache, return_taps=True)
        g = torch.Generator().manual_seed(9)
        anchors = sample(probabilities(res.logits[torch.cumsum(lens, 0) - 1], PARAMS[mode]), g)
        p = drafter.propose(slots, flat, TargetFeatures(res.taps, res.last_hidden), lens, anchors, gamma,
                            PARAMS[mode], g)  # fmt: skip
        assert p.tokens.device.type == "cpu" and p.probs.device.type == "cpu"
        return plain([p.tokens, p.probs.sum(-1), p.confidence])

    expected, got = on_meta(run)
    assert got == expected


def test_no_drafter_proposes_on_the_input_device(tiny_model):
    slots = torch.arange(3)
    with torch.device("meta"):
        p = NoDrafter(97).propose(slots, slots, None, slots, slots, 0, PARAMS["greedy"], torch.Generator())
    assert p.tokens.device == p.probs.device == slots.device and p.tokens.shape == (3, 0)


def test_scheduler_functions():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(6, 4, generator=g)
    conf[1] = conf[0]  # exact ties

    def run():
        survivals = prefix_survival(conf, TEMPERATURES)  # temperatures (float64, CPU) follow conf
        lengths = prefix_schedule(survivals, PROFILE)
        out = [survivals, greedy_path(survivals), lengths, prefix_schedule(survivals, PROFILE, early_stop=False),
               prefix_schedule(survivals, PROFILE, budget=5), expected_rate(survivals, lengths, PROFILE)]  # fmt: skip
        for name in POLICY_NAMES:
            scheduler = Scheduler(make_policy(name), PROFILE, TEMPERATURES)
            for _ in range(3):  # dspark-async needs two rounds of history
                ell = scheduler(_proposal(conf, with_confidence=True))
                scheduler.observe(ell, ell // 2)
            out.append(ell)
        out.append(Scheduler(make_policy("fixed"), PROFILE)(_proposal(conf)))
        assert all(t.device.type == "cpu" for t in out if isinstance(t, torch.Tensor))
        return plain(out)

    expected, got = on_meta(run)
    assert got == expected


def _proposal(conf, with_confidence=False):
    from dspark.drafters.base import Proposal

    R, gamma = conf.shape
    tokens = torch.zeros(R, gamma, dtype=torch.long, device=conf.device)
    return Proposal(tokens, torch.zeros(R, gamma, 5), conf if with_confidence else None)


def test_verify_and_sampling():
    g = torch.Generator().manual_seed(1)
    R, gamma, V = 5, 3, 11
    q = torch.softmax(torch.randn(R, gamma, V, generator=g), -1)
    p = torch.softmax(torch.randn(R, gamma + 1, V, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(R, gamma)
    lens = torch.tensor([0, 1, 2, 3, 3])

    def run():
        gen = torch.Generator().manual_seed(2)
        result = verify(drafts, q, p, lens, *draw_uniforms(R, gamma, gen, device=drafts.device))
        sampled = [sample(probabilities(p[:, 0] * 7, params), gen) for params in PARAMS.values()]
        return plain([result.accepted, result.next_token, *sampled])

    expected, got = on_meta(run)
    assert got == expected


def test_calibration_metrics():
    g = torch.Generator().manual_seed(3)
    conf = torch.rand(200, 3, generator=g, dtype=torch.float64)
    events = (torch.rand(200, 3, generator=g, dtype=torch.float64) < conf).double().cumprod(1)
    mask = torch.ones(200, 3, dtype=torch.bool)

    def run():
        temps = calibration.fit_sts(conf, events, mask)
        return plain([temps, calibration.position_metrics(conf, events, mask, temps)])

    expected, got = on_meta(run)
    assert got == expected


def test_the_meta_trick_catches_a_tensor_made_on_the_default_device(tiny_model):
    """The guard itself: code that makes a tensor without a device fails inside the context."""

    def careless(x):
        return x + torch.arange(x.shape[0])

    x = torch.zeros(3)
    assert careless(x).tolist() == [0, 1, 2]
    with torch.device("meta"), pytest.raises((RuntimeError, NotImplementedError)):
        careless(x).tolist()


# ---- static scan -----------------------------------------------------------------------------------
SCANNED = ["dspark/engine.py", "dspark/engine.py", "dspark/drafters", "dspark/verify.py",
           "dspark/sampling.py", "dspark/decoding.py", "dspark/kv_cache.py", "dspark/model.py",
           "dspark/scheduler.py", "dspark/calibration.py"]  # fmt: skip
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn", "randint",
             "randperm", "linspace", "logspace", "eye", "tril_indices", "triu_indices"}  # fmt: skip
ALLOWED = {  # (file, function): why a tensor may be made on the default device there
    ("dspark/model.py", "rope_table"): "built once in a constructor; a buffer, moved with the module",
    ("dspark/model.py", "RMSNorm.__init__"): "a parameter, moved with the module",
    ("dspark/drafters/__init__.py", "get_calibration"): "STS temperatures read from JSON to the CPU; "
    "prefix_survival moves them to the confidences' device",
    ("dspark/calibration.py", "<module>"): "the STS temperature grid, moved to the data's device",
}


def factory_calls_without_device(path: Path) -> list[str]:
    """`torch.<factory>(...)` calls with no device= keyword, as 'file:line Class.function: torch.name'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if function == "<module>" else f"{function}.{child.name}"
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                f = child.func
                if (isinstance(f.value, ast.Name) and f.value.id == "torch" and f.attr in FACTORIES
                        and not any(k.arg == "device" for k in child.keywords)):  # fmt: skip
                    rel = path.relative_to(ROOT).as_posix()
                    if (rel, function) not in ALLOWED:
                        found.append(f"{rel}:{child.lineno} {function}: torch.{f.attr} without device=")
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_no_tensor_factory_without_a_device_in_the_hot_paths():
    files = []
    for name in SCANNED:
        path = ROOT / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    found = [hit for path in files for hit in factory_calls_without_device(path)]
    assert not found, "pass device= (or use *_like / new_*), or allow-list with a reason:\n" + "\n".join(
        found
    )


def test_the_static_scan_sees_a_careless_factory(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    path = tmp_path / "m.py"
    code = "import torch\n\nclass A:\n    def f(x):\n        return x + torch.arange(3), torch.ones(2, device=x.device)\n"
    path.write_text(code)
    assert factory_calls_without_device(path) == ["m.py:5 A.f: torch.arange without device="]
