"""Where tensors live, every host read of the hot paths counted, and kernel-or-reference per call.

The rule: **a tensor is made on the device of the data it goes with** (the model's, a drafter's weights',
or the inputs'), never torch's default device. The one exception: uniforms are drawn on the generator's own
device and moved, so a seed gives the same tokens on CPU and GPU. A host read waits for the device, so hot
paths read only where the host must decide (a shape, a stop), through `to_host`, which counts it.
`use_kernel` picks a Triton kernel or the PyTorch reference; modes via `set_kernel_mode` or DSPARK_KERNELS:
"auto" (kernel on CUDA tensors), "reference", "triton" (on CPU only with TRITON_INTERPRET=1).
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
    Not counted under `torch.compile` (a counter there recompiles every call)."""
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
    """U[0, 1) of `shape` drawn on `generator`'s device, then moved: the same draws on every device."""
    drawn = torch.rand(shape, generator=generator, device=generator.device, dtype=dtype)
    return drawn.to(device, non_blocking=True)


# ---- a hot path runs its Triton kernel or its PyTorch reference ----
KERNEL_MODES = ("auto", "triton", "reference")


def _mode_from_env() -> str:
    mode = os.environ.get("DSPARK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise ValueError(f"DSPARK_KERNELS must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    return mode


_mode: str | None = None  # set by set_kernel_mode; None: DSPARK_KERNELS decides (read when first needed)


def kernel_mode() -> str:
    """The mode in force; DSPARK_KERNELS is read here, not at import, so a bad value breaks no import."""
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
