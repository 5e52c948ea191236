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

What this file does not do: choose kernels (dspark/backend.py) or move models.
"""

from __future__ import annotations

from collections import Counter

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
