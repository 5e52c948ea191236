"""Where tensors live, and every host read of the hot paths counted.

The rule: **a tensor is made on the device of the data it goes with** (the model's, a drafter's weights',
or the inputs'), never torch's default device. The one exception: uniforms are drawn on the generator's own
device and moved, so a seed gives the same tokens on CPU and GPU. A host read waits for the device, so hot
paths read only where the host must decide (a shape, a stop), through `to_host`, which counts it.
Which hot path runs its Triton kernel instead of the PyTorch reference is `dspark_kernels.use_kernel`'s call.
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
