"""Which implementation runs a hot path: a Triton kernel (`kernels/`) or its PyTorch reference.

Four hot paths have a kernel: the Markov-head block sampler, the rejection
sampler, the ragged verify attention and the prefix scheduler. Each has one
PyTorch reference in `dspark/` (the ground truth the kernel is tested
against) and a dispatching function next to it that asks `use_kernel(...)`.

Modes (`set_kernel_mode`, or the environment variable DSPARK_KERNELS):
  * "auto" (default): the kernel for CUDA tensors, the reference on CPU. If
    Triton cannot be imported (e.g. on macOS) CUDA tensors also get the
    reference, after a one-line notice.
  * "reference": always the PyTorch reference.
  * "triton": always the kernel. On CPU tensors that only works under
    Triton's interpreter: TRITON_INTERPRET=1 must be set before the kernel
    modules are imported (the tests and walkthrough 08 do this).

What this file does not do: import Triton itself (`kernels/__init__.py` does,
and only when a kernel may actually run).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

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
