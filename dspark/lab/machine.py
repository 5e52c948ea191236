"""This machine, as benchmarks and commands describe and choose it: its CPU's matmul instructions, the one-line
description a benchmark's header and a cached timing's key carry, `--device`, and the progress bar of a
one-off measurement of it."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import psutil
import torch
from tqdm import tqdm

BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of bf16 matmul instructions


def cpu_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """The "key: value" lines of /proc/cpuinfo (or of `cpuinfo`); empty where the file is missing."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.is_file() else ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 matmul instructions (AVX-512 BF16 or AMX). Without them torch emulates bf16:
    a bf16-autocast drafter training step was 14x slower than fp32 on an AVX2-only EPYC (12.7 vs 0.93 s)."""
    return bool(BF16_FLAGS & set(cpu_fields(cpuinfo).get("flags", "").split()))


def cpu_description(cpuinfo: str | None = None) -> str:
    """This CPU for a benchmark's header: model, the vector instructions that decide its matmul speed,
    torch's thread count and, when set, OpenMP's wait policy, e.g. "AMD EPYC, AVX-512 + BF16, 2 threads" (AMX tiles,
    where present, are named too: "+ AMX"; they, not AVX-512 BF16, made bf16 matmuls ~8x faster than fp32) or
    "..., 2 threads, OMP_WAIT_POLICY=PASSIVE". Timings depend on all of these: bf16 matmuls are fast only with
    BF16 instructions (emulated without), per-op overhead varies between machines, and passive waiting wakes
    sleeping threads for every parallel op (SmolLM2 bf16 on an idle 2-core AVX-512 EPYC: a decode step 24-30 ms
    with the default spinning, 45-57 ms passive), while spinning threads on a busy machine can be many
    times slower still. The cached SPS and drafting-cost tables are keyed by this line, so a table measured
    under one policy never prices steps run under the other.
    `cpuinfo`: the text of /proc/cpuinfo (read when None; where it is missing, only the platform's name)."""
    fields = cpu_fields(cpuinfo)
    name = fields.get("model name") or platform.processor() or platform.machine() or "CPU"
    flags = set(fields.get("flags", "").split())
    if "avx512f" in flags:
        vector = (
            "AVX-512"
            + (" + BF16" if BF16_FLAGS & flags else ", no BF16")
            + (" + AMX" if "amx_bf16" in flags else "")
        )
    elif "avx2" in flags:
        vector = "AVX2 (no AVX-512, no BF16)"
    else:
        vector = ""
    wait = os.environ.get("OMP_WAIT_POLICY", "").strip()
    policy = f"OMP_WAIT_POLICY={wait.upper()}" if wait else ""
    return ", ".join(x for x in (name, vector, f"{torch.get_num_threads()} threads", policy) if x)


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process has used since boot, of them this process's): psutil's busy times (stolen
    time counts: another guest had the core)."""
    t = psutil.cpu_times()
    total = sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
    own = psutil.Process().cpu_times()
    return total, own.user + own.system


class OtherLoad:
    """`with OtherLoad() as load: ...`, then `load.cores`: the CPU other processes used meanwhile, in cores
    (their CPU seconds per second). A measurement with other work running steadily beside it has repeats
    that agree and are all slow; their spread cannot show it, this can."""

    cores = 0.0

    def __enter__(self) -> OtherLoad:
        self._start = (*busy_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        (total0, own0, wall0), (total, own) = self._start, busy_seconds()
        self.cores = max(0.0, (total - total0) - (own - own0)) / max(time.perf_counter() - wall0, 1e-9)


def resolve_device(name: str | None) -> torch.device:
    """`--device`: "cpu", "cuda" (or "cuda:N"), or None for cuda when available, else cpu.
    ValueError with one line when CUDA is asked for and missing."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {name!r}")
    return device


class MeasureProgress:
    """A progress bar on stderr for a one-off measurement of this machine, called as `tick(stage, done,
    total)`: the first call prints `header` (what is measured and why), then each stage gets a bar. Nothing is
    printed when nothing is measured (everything was cached)."""

    def __init__(self, header: str) -> None:
        self.header, self.bar, self.stage = header, None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.stage is None:
            print(self.header, file=sys.stderr, flush=True)
        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=f"  {stage}", unit="round", leave=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
