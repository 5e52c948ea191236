"""Where tensors live, and every host <-> device crossing of the hot paths, counted.

The rule: **a tensor is made on the device of the data it goes with.** The engine and
plain decoding use the model's device (`model_device(target)`, its embedding's);
a drafter, its own weights' (moved with the target: `drafters.registry.load_drafter`);
the pure functions -- sampling, verify, the scheduler, the calibration metrics -- the
device of their input tensors. Nothing is made on torch's default device, which
`tests/test_device.py` checks by running everything inside `with torch.device("meta")`.

One exception, on purpose: random uniforms are drawn from a `torch.Generator` on the
generator's own device (a CPU generator by default) and then moved (`generator_uniforms`), so
the same seed gives the same tokens on a CPU and on a GPU.

Host syncs. Reading a device tensor on the host (`.tolist()`, `int(t)`, `.item()`,
a Python loop over it) waits for everything queued on the device. The hot paths do it
only where the host must decide something (a shape, a stop, a record), always through
`to_host(tensor, reason)`, which counts it under its reason (`host_sync_counts`), so
the engine can report syncs per step honestly (`EngineResult.host_syncs`). Uploads of
host values (`upload`) do not wait for the device: a pageable host buffer is staged by
the driver and the copy is queued (`non_blocking=True`).

Kernels. Four hot paths have a Triton kernel (`kernels/`): the Markov-head block sampler, the rejection
sampler, the ragged verify attention and the prefix scheduler. Each has one PyTorch reference beside a
dispatching function that asks `use_kernel(...)`. Modes (`set_kernel_mode`, or DSPARK_KERNELS): "auto"
(default: the kernel for CUDA tensors, the reference on CPU; without Triton, the reference after a one-line
notice), "reference" (always), "triton" (always; CPU tensors only under Triton's interpreter,
TRITON_INTERPRET=1 set before the kernel modules are imported). This file never imports Triton itself.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_SYNCS: Counter[str] = Counter()  # reason -> device-to-host reads so far (this process)


def model_device(module: torch.nn.Module) -> torch.device:
    """The device a model's tensors live on (its first parameter's)."""
    return next(module.parameters()).device


def to_host(tensor: torch.Tensor, reason: str):
    """`tensor.tolist()`, counted under `reason`: the one way the hot paths read a device tensor.
    Not counted inside code that `torch.compile` traces (a counter there would be guarded on and
    recompile every call); `tolist` is a graph break there anyway."""
    if not torch.compiler.is_compiling():
        _SYNCS[reason] += 1
    return tensor.tolist()


def host_syncs() -> int:
    """Device-to-host reads through `to_host` so far."""
    return sum(_SYNCS.values())


def host_sync_counts() -> dict[str, int]:
    """Device-to-host reads so far, per reason (a copy)."""
    return dict(_SYNCS)


def upload(values, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values (a list, nested lists) -> a tensor on `device`, queued without waiting for the device."""
    return torch.tensor(values, dtype=dtype, device="cpu").to(device, non_blocking=True)


def generator_uniforms(
    shape: tuple[int, ...],
    generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """U[0, 1) of `shape` drawn from `generator` on its own device, then moved to `device`:
    the same draws on every device for the same seed."""
    drawn = torch.rand(shape, generator=generator, device=generator.device, dtype=dtype)
    return drawn.to(device, non_blocking=True)


# ---- which implementation runs a hot path: a Triton kernel or its PyTorch reference ----------------------
KERNEL_MODES = ("auto", "triton", "reference")


def _mode_from_env() -> str:
    mode = os.environ.get("DSPARK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise ValueError(f"DSPARK_KERNELS must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    return mode


_mode: str | None = None  # set by set_kernel_mode; None: DSPARK_KERNELS decides (read when first needed)


def kernel_mode() -> str:
    """The mode in force. DSPARK_KERNELS is read here, not at import, so a bad value is reported by the
    command that needs it (one line) instead of breaking every `import dspark`."""
    return _mode if _mode is not None else _mode_from_env()


def set_kernel_mode(mode: str) -> None:
    """Pick "auto", "triton" or "reference" for every hot path from now on."""
    global _mode
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernel mode must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    _mode = mode


@contextmanager
def kernels_as(mode: str) -> Iterator[None]:
    """`with kernels_as("triton"): ...` runs a block in one mode, then restores the previous one."""
    global _mode
    previous = _mode
    set_kernel_mode(mode)
    try:
        yield
    finally:
        _mode = previous


def use_kernel(*tensors: torch.Tensor) -> bool:
    """Should the hot path that received `tensors` run its Triton kernel?"""
    mode = kernel_mode()
    if mode == "reference":
        return False
    on_gpu = all(t.is_cuda for t in tensors)
    if mode == "auto" and not on_gpu:
        return False
    import kernels

    if not kernels.available():  # imports Triton; never raises, prints one line if it is missing
        if mode == "triton":
            raise RuntimeError(
                f"kernel mode 'triton' was forced but Triton is unusable: {kernels.unavailable_reason()}"
            )
        return False
    if not on_gpu and not kernels.interpreting():
        raise RuntimeError(
            "kernel mode 'triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "before the kernels are imported (or use mode 'auto'/'reference')"
        )
    return True
