"""dspark/lab/machine.py and the commands' device options: device choice, one-line CUDA errors, the GPU
dry run, the CPU description and where bf16 is picked."""

from __future__ import annotations

import json

import pytest
import torch

from dspark.lab import machine


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
