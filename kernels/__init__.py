"""Triton kernels for DSpark's four hot paths, each next to the PyTorch reference it must match.

  markov_sampler.py     the Markov sequential head for a whole draft block (paper §3.1)
  rejection_sampler.py  lossless verification of ragged draft blocks (DESIGN §1)
  ragged_attention.py   variable-length verify attention against the KV cache (paper §5.3)
  prefix_scheduler.py   survivals → Algorithm 1 → verify lengths, on the device (paper §3.2.2)
  inverse_cdf.py        the token-drawing device function the two samplers share
  bench.py              `python -m kernels.bench`: kernel vs reference timings on a CUDA GPU

Every kernel file reads top to bottom: what it computes → which function in
`dspark/` is its reference → the kernel with each argument explained → a
wrapper that checks shapes, dtypes and contiguity. `dspark` picks kernel or
reference per call (`dspark/backend.py`): kernels for CUDA tensors, the
reference on CPU, unless a mode is forced.

On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set
before the kernel modules are imported; fp32 only): correct, and slow; that is
how the tests check them against the references on a machine without a GPU.

Importing this package never fails: where Triton is missing (macOS, or a
broken install) `AVAILABLE` is False, one line says so, and dspark keeps
using the references.
"""

from __future__ import annotations

import os
import sys

try:
    import triton  # noqa: F401

    AVAILABLE, REASON = True, ""
except Exception as exc:  # ImportError on macOS/Windows, or a broken install
    AVAILABLE, REASON = False, f"{type(exc).__name__}: {exc}"
    print(f"dspark: Triton unavailable ({REASON}); using the PyTorch references", file=sys.stderr)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
