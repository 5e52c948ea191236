"""Kernel-or-reference dispatch (dspark_kernels/__init__.py), life without Triton, and `python -m dspark.bench kernels`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import dspark_kernels as kernels

ROOT = Path(__file__).resolve().parents[2]
ON_GPU, ON_CPU = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)  # all use_kernel reads


def test_modes_validate_and_restore():
    with pytest.raises(ValueError, match="auto, triton, reference"):
        kernels.set_kernel_mode("fast")
    before = kernels.kernel_mode()
    with kernels.kernels_as("reference"):
        assert kernels.kernel_mode() == "reference"
    assert kernels.kernel_mode() == before


def test_auto_uses_kernels_only_for_cuda_tensors(monkeypatch):
    monkeypatch.setattr(kernels, "_status", (True, ""))
    with kernels.kernels_as("auto"):
        assert not kernels.use_kernel(torch.zeros(2))
        assert kernels.use_kernel(ON_GPU, ON_GPU)
        assert not kernels.use_kernel(ON_GPU, ON_CPU)  # mixed devices: leave it to the reference
    with kernels.kernels_as("reference"):
        assert not kernels.use_kernel(ON_GPU)


def test_missing_triton_degrades_in_auto_and_fails_loudly_when_forced(monkeypatch):
    monkeypatch.setattr(kernels, "_status", (False, "ModuleNotFoundError: No module named 'triton'"))
    with kernels.kernels_as("auto"):
        assert not kernels.use_kernel(ON_GPU)
    with kernels.kernels_as("triton"), pytest.raises(RuntimeError, match="Triton is unusable"):
        kernels.use_kernel(ON_GPU)


def test_forcing_kernels_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "_status", (True, ""))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with kernels.kernels_as("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.use_kernel(torch.zeros(2))


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


BLOCK_TRITON = "import sys; sys.modules['triton'] = None\n"  # `import triton` now raises ImportError


def test_without_triton_dspark_still_verifies_and_says_so_once():
    code = BLOCK_TRITON + (
        "import torch\nimport dspark_kernels as kernels\n"
        "from dspark_kernels import use_kernel\n"
        "from dspark.verify import verify\n"
        "assert not kernels.available() and not kernels.available()\n"
        "gpu = type('T', (), {'is_cuda': True})()\n"
        "assert not use_kernel(gpu)\n"
        "p = torch.full((2, 2, 3), 1 / 3)\n"
        "out = verify(torch.zeros(2, 1, dtype=torch.long), p[:, :1].contiguous(), p, torch.ones(2, dtype=torch.long),"
        " torch.rand(2, 1), torch.rand(2))\n"
        "print(out.accepted.tolist())\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1, 1]"  # u·q < p with p = q: accepted
    notice = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(notice) == 1 and "Triton unavailable" in notice[0]


def test_bench_without_triton_or_gpu_exits_with_a_message():
    bench = "import runpy, sys; sys.argv = ['dspark.bench', 'kernels']; runpy.run_module('dspark.bench', run_name='__main__')"
    result = run_python(BLOCK_TRITON + bench)
    assert (
        result.returncode == 1
        and "Triton is not usable" in result.stderr
        and "Traceback" not in result.stderr
    )
    if not torch.cuda.is_available():
        result = subprocess.run(
            [sys.executable, "-m", "dspark.bench", "kernels"], cwd=ROOT, capture_output=True, text=True
        )
        assert result.returncode == 1 and "no CUDA GPU" in result.stderr and "Traceback" not in result.stderr


def test_bench_interpreter_smoke_run(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "dspark.bench",
        "kernels",
        "--interpret",
        "--requests",
        "2",
        "--gamma",
        "3",
        "--json",
        str(out),
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {row["kernel"] for row in rows} == {
        "markov sampler",
        "rejection sampler",
        "ragged attention",
        "prefix scheduler",
    }
    assert all("DIFFER" not in row["agreement"] for row in rows)
    assert "NOT speed" in result.stdout


def test_bench_rejects_bad_arguments():
    result = subprocess.run([sys.executable, "-m", "dspark.bench", "kernels", "--interpret", "--requests", "a,b"],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2 and "comma-separated" in result.stderr


def test_every_kernel_compiles_for_an_h200_without_a_gpu(tmp_path):
    """The interpreter accepts some code the GPU compiler rejects: compile each kernel for sm_90."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a fresh compile, as on a clean machine
    out = tmp_path / "compile.json"
    cmd = [sys.executable, "-m", "dspark.bench", "kernels", "--compile-only", "--json", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) >= 4 and all(row["result"].startswith("ok") for row in rows)


def test_a_third_party_kernels_package_does_not_shadow_ours(tmp_path):
    """`transformers` >= 5 installs Hugging Face's `kernels` package; dspark's own Triton package is
    `dspark_kernels`, so a `kernels` earlier on the path changes nothing."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("raise ImportError('the other kernels package')\n")
    code = "import dspark.model, dspark.verify, dspark_kernels; print(dspark_kernels.__file__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).parent == ROOT / "dspark_kernels"
