"""Device-awareness without a GPU: every hot path creates its tensors on its inputs' device.

The trick: run the engine, speculative and plain decoding, every drafter's `propose`, the
scheduler, verify and the calibration metrics with CPU models and CPU inputs *inside*
`with torch.device("meta")` (PyTorch's default-device context). A tensor factory called
without an explicit device then makes a meta tensor, and the run fails (meta mixed with CPU,
or `.tolist()` on meta). Device-aware code makes everything on its inputs' device, so the run
succeeds, and its output must equal the same run outside the context (greedy, and sampled with
a fixed seed). A static `ast` scan backs it up, and `python -m dspark.bench gpu --dry-run`
runs here so the GPU benchmark cannot rot.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from test_parallel_drafter import make
from test_speculative import make_drafter, prompts

from dspark import device as dev
from dspark.decoding import generate
from dspark.drafters.base import NoDrafter, TargetFeatures
from dspark.engine import Engine, Request, speculative_generate
from dspark.lab import calibration, machine
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
    scheduled_lengths,
)
from dspark.verify import draw_uniforms, verify

ROOT = Path(__file__).resolve().parents[1]
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


def on_meta(run):
    """run() outside and then inside the meta default-device context; both results, as plain values."""
    expected = run()
    with torch.device("meta"):
        got = run()
    return expected, got


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
        assert len(result.host_syncs) == result.steps
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
               prefix_schedule(survivals, PROFILE, budget=5), scheduled_lengths(conf, TEMPERATURES, PROFILE),
               expected_rate(survivals, lengths, PROFILE)]  # fmt: skip
        for name in POLICY_NAMES:
            policy = make_policy(name)
            for _ in range(3):  # dspark-async needs two rounds of history
                ell = policy.lengths_from_confidence(conf, TEMPERATURES, 4, PROFILE)
                policy.observe(ell, ell // 2)
            out.append(ell)
        out.append(Scheduler(make_policy("fixed"), PROFILE)(_proposal(conf)))
        assert all(t.device.type == "cpu" for t in out if isinstance(t, torch.Tensor))
        return plain(out)

    expected, got = on_meta(run)
    assert got == expected


def _proposal(conf):
    from dspark.drafters.base import Proposal

    R, gamma = conf.shape
    return Proposal(torch.zeros(R, gamma, dtype=torch.long, device=conf.device), torch.zeros(R, gamma, 5))


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


# ---- syncs are counted -----------------------------------------------------------------------------
def test_host_syncs_are_counted_per_engine_step(tiny_model):
    drafter = build("dspark", tiny_model)
    scheduler = Scheduler.for_drafter(make_policy("dspark"), drafter, PROFILE, TEMPERATURES)
    engine = Engine(tiny_model, drafter, PARAMS["sampled"], 4, 3, None, scheduler)
    before = dev.host_sync_counts()
    result = engine.run([Request(p, 12) for p in prompts([4, 9, 3], seed=8)])
    after = dev.host_sync_counts()
    assert result.steps > 0 and len(result.host_syncs) == result.steps
    # every step (README, "On a GPU"): the drafter's ragged index, Algorithm 1's walk (the reference), the
    # verify lengths, the target pass's ragged index, verify's length check (the reference), the outcome
    assert result.host_syncs == [6] * result.steps
    assert sum(after.values()) - sum(before.values()) == sum(result.host_syncs) + result.prefill_host_syncs


# ---- static scan -----------------------------------------------------------------------------------
SCANNED = ["dspark/engine.py", "dspark/engine.py", "dspark/drafters", "dspark/verify.py",
           "dspark/sampling.py", "dspark/decoding.py", "dspark/kv_cache.py", "dspark/model.py",
           "dspark/scheduler.py", "dspark/calibration.py"]  # fmt: skip
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn", "randint",
             "randperm", "linspace", "logspace", "eye", "tril_indices", "triu_indices"}  # fmt: skip
ALLOWED = {  # (file, function): why a tensor may be made on the default device there
    ("dspark/model.py", "rope_table"): "built once in a constructor; a buffer, moved with the module",
    ("dspark/model.py", "RMSNorm.__init__"): "a parameter, moved with the module",
    ("dspark/drafters/__init__.py", "load_calibration"): "STS temperatures read from JSON to the CPU; "
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


# ---- the command line ------------------------------------------------------------------------------
def test_device_choice():
    assert machine.resolve_device("cpu") == torch.device("cpu")
    assert machine.resolve_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            machine.resolve_device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("argv", [["generate", "hi"], ["bench", "ar"], ["bench", "serve"], ["train", "responses"],
                                  ["train", "calibrate"], ["bench", "gpu"]])  # fmt: skip
def test_cuda_without_cuda_is_one_line(argv, capsys):
    import importlib

    from dspark.lab.cli import run_main

    module = importlib.import_module(f"dspark.{argv[0]}")
    code = run_main(module.main, [*argv[1:], "--device", "cuda"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "CUDA" in err and "Traceback" not in err


def test_generate_on_an_explicit_cpu_device(small_checkpoint, capsys):
    from dspark import generate as generate_cmd
    from dspark.lab.cli import run_main

    argv = [
        "Hello",
        "--max-new-tokens",
        "4",
        "--json",
        "--checkpoint",
        str(small_checkpoint),
        "--drafter",
        "none",
    ]
    assert run_main(generate_cmd.main, [*argv, "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == "cpu"


# ---- the GPU benchmark's dry run -------------------------------------------------------------------
def test_bench_gpu_dry_run(tmp_path, capsys, monkeypatch):
    from dspark import bench
    from dspark.lab.cli import run_main

    # its SPS profile and drafting costs are measured into a DSPARK_HOME of its own: timed while the rest of
    # the suite runs, they would poison the developer's cache (and every later benchmark that reads it)
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))

    out = tmp_path / "gpu.json"
    assert run_main(bench.main, ["gpu", "--dry-run", "--json", str(out), "--out", str(tmp_path)]) == 0
    assert "expected run time" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["benchmark"] == "gpu" and record["dry_run"] is True and record["device"]["type"] == "cpu"
    assert set(record) >= {
        "kernels",
        "batch1",
        "engine",
        "sps",
        "compile",
        "syncs",
        "training",
        "smollm2",
        "seconds",
    }
    assert [(r["drafter"], r["layers"]) for r in record["training"]] == [("dspark", 5), ("dflash", 5), ("eagle", 1),
                                                                          ("mtp", 1)]  # fmt: skip
    assert all(r["anchors_per_s"] > 0 and r["anchors_per_step"] == 2 * 9 for r in record["training"])
    assert record["smollm2"].startswith("pending")
    kernel_rows = record["kernels"]["rows"]
    assert record["kernels"]["status"].startswith("skipped") or {r["kernel"] for r in kernel_rows} == {
        "markov sampler", "rejection sampler", "ragged attention", "prefix scheduler"}  # fmt: skip
    assert {r["drafter"] for r in record["batch1"]} == {"none", "mtp", "eagle", "dflash", "dspark"}
    for row in record["batch1"]:
        assert row["tokens_per_s"] > 0 and row["tau"] >= 1 and row["speedup"] > 0
    assert {(p["policy"], p["concurrency"]) for p in record["engine"]} == {
        (policy, c) for policy in ("none", "mtp1", "fixed", "dspark") for c in (1, 2)}  # fmt: skip
    for point in record["engine"]:
        assert point["throughput"] > 0 and point["tau"] >= 1
    assert {r["policy"] for r in record["syncs"]["rows"]} == {"none", "mtp1", "fixed", "dspark"}
    assert all(r["counted_per_step"] > 0 for r in record["syncs"]["rows"])
    sps = record["sps"]["measured"]
    assert len(sps["steps_per_second"]) == max(sps["batch_tokens"]) and sps["name"]
    assert all(row["plain_ms"] > 0 and row["compiled_ms"] > 0 for row in record["compile"]["rows"])
    assert record["syncs"]["counted_per_step"]
    # (how long the dry run took is the machine's business: on a fresh DSPARK_HOME it measures the CPU drafting cost)
    assert (tmp_path / "gpu.md").is_file() and record["seconds"] > 0


def test_cpu_description_names_the_openmp_wait_policy(monkeypatch):
    """Passive and spinning OpenMP threads time the same step very differently, so the header (and the
    cached SPS / drafting-cost tables keyed by it) name the policy when one is set, and nothing otherwise."""
    avx512 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    default = machine.cpu_description(avx512)
    assert "OMP_WAIT_POLICY" not in default
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert machine.cpu_description(avx512) == default + ", OMP_WAIT_POLICY=PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert machine.cpu_description(avx512).endswith(", OMP_WAIT_POLICY=ACTIVE")


def test_cpu_description_names_the_vector_instructions(monkeypatch):
    """Benchmark headers say which instructions the timings ran on (bf16 matmuls are emulated without BF16)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    avx512 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
    avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx2\n"
    threads = f"{torch.get_num_threads()} threads"
    assert machine.cpu_description(avx512) == f"AMD EPYC 9R14, AVX-512 + BF16, {threads}"
    assert machine.cpu_description(avx2) == f"AMD EPYC, AVX2 (no AVX-512, no BF16), {threads}"
    assert machine.cpu_description(avx512.replace(" avx512_bf16", "")).startswith(
        "AMD EPYC 9R14, AVX-512, no BF16"
    )
    amx = avx512.replace("avx512_bf16", "avx512_bf16 amx_bf16 amx_tile").replace(
        "AMD EPYC 9R14", "Intel Xeon"
    )
    assert machine.cpu_description(amx) == f"Intel Xeon, AVX-512 + BF16 + AMX, {threads}"
    assert machine.cpu_description("").endswith(threads)  # no /proc/cpuinfo: still a line
    assert threads in machine.cpu_description()


def test_drafter_training_picks_bf16_only_where_the_cpu_has_it(monkeypatch):
    """`train drafter` without --bf16/--no-bf16 trains in bf16 autocast only on a CPU with BF16 (or AMX)
    instructions: elsewhere torch emulates bf16 and a step is many times slower than fp32."""
    from dspark.lab.commands import train
    from dspark.lab.train_commands import drafter as train_drafter

    avx512 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
    assert machine.cpu_has_bf16(avx512) and machine.cpu_has_bf16("flags\t: avx2 amx_bf16\n")
    assert not machine.cpu_has_bf16("flags\t: fpu sse avx2 avx512f\n") and not machine.cpu_has_bf16("")
    for native in (True, False):
        monkeypatch.setattr(train_drafter, "cpu_has_bf16", lambda native=native: native)
        assert train_drafter.training_in_bf16(None) is native
        assert train_drafter.training_in_bf16(True) is True and train_drafter.training_in_bf16(False) is False
    assert train.build_parser().parse_args(["drafter", "--kind", "dspark"]).bf16 is None


def test_a_pretrained_target_defaults_to_bf16_only_where_bf16_is_native(monkeypatch):
    """--model without --dtype: bfloat16 on a GPU or a CPU with BF16 instructions, float32 on a CPU that would
    emulate bf16; the shipped tiny target is always float32."""
    from dspark.lab import cli

    cpu, gpu = torch.device("cpu"), torch.device("meta")  # (any non-CPU device stands for the GPU)
    for native in (True, False):
        monkeypatch.setattr(cli, "cpu_has_bf16", lambda native=native: native)
        assert cli.default_dtype_name("smollm2-135m", cpu) == ("bfloat16" if native else "float32")
        assert cli.default_dtype_name("smollm2-135m", gpu) == "bfloat16"
        assert cli.default_dtype_name(None, cpu) == cli.default_dtype_name(None, gpu) == "float32"
