"""Triton kernels for DSpark's four hot paths, each next to the PyTorch reference it must match.

  markov_sampler.py     the Markov sequential head for a whole draft block (paper §3.1)
  rejection_sampler.py  lossless verification of ragged draft blocks (walkthrough/DESIGN.md §8)
  ragged_attention.py   variable-length verify attention against the KV cache (paper §5.3)
  prefix_scheduler.py   survivals → Algorithm 1 → verify lengths, on the device (paper §3.2.2)
  inverse_cdf.py        the token-drawing device function the two samplers share

Every kernel file reads top to bottom: what it computes → which function in
`dspark/` is its reference → the kernel with each argument explained → a
wrapper that checks shapes, dtypes and contiguity. `use_kernel` (below) picks
kernel or reference per call: kernels for CUDA tensors, the reference on CPU,
unless a mode is forced (`set_kernel_mode`, `kernels_as`, or DSPARK_KERNELS:
"auto", "reference", "triton" -- on CPU only with TRITON_INTERPRET=1).

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set
before the kernel modules are imported; fp32 only): correct, and slow; that is
how the tests check them against the references on a machine without a GPU.

Importing this package never fails and does not import Triton; `available()`
does, once: where Triton is missing (macOS, or a broken install) it returns
False, one line says so, and dspark keeps using the references.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_status: tuple[bool, str] | None = None  # (usable, why not), filled by the first `available()`


def available() -> bool:
    """Can Triton be imported? Tried once; on failure one line goes to stderr.

    Importing Triton is deferred to this call because Triton decides at import
    time whether it interprets (TRITON_INTERPRET=1): callers set that first."""
    global _status
    if _status is None:
        # keep Triton 3.9's default (fused multiply-add on) explicitly, which also silences its warning
        os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        try:
            import triton  # noqa: F401

            _status = (True, "")
        except Exception as exc:  # ImportError on macOS/Windows, or a broken install
            _status = (False, f"{type(exc).__name__}: {exc}")
            print(f"dspark: Triton unavailable ({_status[1]}); using the PyTorch references", file=sys.stderr)
    return _status[0]


def unavailable_reason() -> str:
    """Why `available()` is False ("" when it is True)."""
    available()
    return _status[1]


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# ---- a hot path runs its Triton kernel or its PyTorch reference: the mode, then the call ----
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


def use_kernel(*tensors) -> bool:
    """Should the hot path that received `tensors` run its Triton kernel?"""
    mode = kernel_mode()
    if mode == "reference":
        return False
    on_gpu = all(t.is_cuda for t in tensors)
    if mode == "auto" and not on_gpu:
        return False
    if not available():  # imports Triton; never raises, prints one line if it is missing
        if mode == "triton":
            raise RuntimeError(
                f"kernel mode 'triton' was forced but Triton is unusable: {unavailable_reason()}"
            )
        return False
    if not on_gpu and not interpreting():
        raise RuntimeError(
            "kernel mode 'triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "before the kernels are imported (or use mode 'auto'/'reference')"
        )
    return True
