"""Where tensors live, and how the hot paths read them.

The rule: **a tensor is made on the device of the data it goes with** (the model's, a drafter's weights',
or the inputs'), never torch's default device. The one exception: uniforms are drawn on the generator's own
device and moved, so a seed gives the same tokens on CPU and GPU. A host read waits for the device, so hot
paths read only where the host must decide (a shape, a stop), each marked `# host sync` (the lab counts them:
dspark/lab/host_reads.py).
Which hot path runs its Triton kernel instead of the PyTorch reference is `dspark_kernels.use_kernel`'s call.
"""

from __future__ import annotations

import torch


def model_device(module: torch.nn.Module) -> torch.device:
    """The device a model's tensors live on (its first parameter's)."""
    return next(module.parameters()).device


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
