"""The CPU speed path, as ONE swap applied to a plain model: where x Wᵀ of a few rows is computed as (W xᵀ)ᵀ.

The paper's premise -- verifying ℓ + 1 tokens costs about what decoding one does -- needs every matmul of a
few rows to stream its weight once. In fp32 on a CPU `F.linear` does that for one row (the matrix-vector
path) but re-packs the whole weight for a matrix product from two rows on. `project_to_vocab` (LM heads) and
`LayerLinear` (decoder-layer projections) take the transposed product instead where that was measured to
pay. The same sums in another order: equal to `F.linear` up to fp32 rounding (walkthrough/DESIGN.md §8).
`fast_on_cpu` applies both to a core model or drafter (the core itself is plain `nn.Linear` and `F.linear`),
as gpt-fast's quantize.py swaps `nn.Linear`; the lab's loaders (`cli.load_target`, `exported.get_drafter`)
apply it, so every command runs with it.

What this file does not do: anything on a GPU, in bf16 or under autograd (all `F.linear`, unchanged).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from dspark.model import Transformer

M = TypeVar("M", bound=nn.Module)

# Where the transposed product pays (measured on a 2-core AVX2 EPYC, weights streamed from memory as in a
# forward pass):
# - a vocabulary projection (`project_to_vocab`) with at least this many weights (V·dim), any number of rows:
#   SmolLM2's 49k-row head (28 M) and an 8k-row draft head (4.7 M), not the tiny target's 4k x 256 head (1 M),
#   where the two forms cost the same and its results stay bit for bit as they were;
TRANSPOSED_PRODUCT_MIN_WEIGHTS = 1 << 21
# - a layer projection (`LayerLinear`: q/k/v/o, gate/up/down, a drafter's context projection) with at least
#   this many weights, at 2..TRANSPOSED_LAYER_MAX_ROWS rows: SmolLM2's 576 x 576 and 576 x 1536 weights
#   (0.40 / 0.94 / 1.00 ms at 4 rows for q, gate, down with `F.linear`, 0.22 / 0.42 / 0.47 ms transposed, 0.20 /
#   0.64 / 0.43 ms for one row), mixed from 48 rows on; not its 192 x 576 k/v (small either way) nor any
#   weight of the tiny target (at most 176 k, cache-resident: its results stay bit for bit as they were)
TRANSPOSED_LAYER_MIN_WEIGHTS = 1 << 18
TRANSPOSED_LAYER_MAX_ROWS = 32
# how these projections compute, named in the keys of cached step timings (a change re-measures them)
PROJECTION_METHOD = (
    f"(W xT)T on cpu fp32: heads from {TRANSPOSED_PRODUCT_MIN_WEIGHTS} weights, layers from "
    f"{TRANSPOSED_LAYER_MIN_WEIGHTS} weights at 2..{TRANSPOSED_LAYER_MAX_ROWS} rows; else F.linear"
)


def transposed_product_pays(
    x: torch.Tensor, weight: torch.Tensor, min_weights: int, max_rows: int | None = None
) -> bool:
    """Whether x Wᵀ is computed as (W xᵀ)ᵀ: more than one row (at most `max_rows`), fp32 on the CPU, no
    autograd, a weight of at least `min_weights` elements."""
    rows = x.numel() // max(1, x.shape[-1])
    return (
        1 < rows <= (max_rows or rows)
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and weight.numel() >= min_weights
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def transposed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., in), weight (out, in) -> (..., out) = x Wᵀ computed as (W xᵀ)ᵀ, made contiguous. The same sum
    in another order: equal to `F.linear` up to fp32 rounding, not bit for bit (nor is `F.linear` with 1 row
    against 8)."""
    flat = x.reshape(-1, x.shape[-1])  # (n, in)
    return torch.mm(weight, flat.T).T.contiguous().view(*x.shape[:-1], weight.shape[0])  # (..., out)


def project_to_vocab(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits x Wᵀ: x (..., dim), weight (V, dim) -> (..., V), the work of an LM head (`F.linear`).

    Computed as (W xᵀ)ᵀ where `transposed_product_pays` with TRANSPOSED_PRODUCT_MIN_WEIGHTS. Measured with
    SmolLM2's 49,152 x 576 head (projection + softmax): `F.linear` 34 / 38 / 41 / 67 ms at 2 / 8 / 16 / 32
    rows, the transposed product 13 / 22 / 28 / 46 ms; one row goes the matrix-vector path either way
    (~12-15 ms), so it keeps `F.linear`. What this does not change: training (autograd), bf16, GPUs, or small
    heads."""
    if transposed_product_pays(x, weight, TRANSPOSED_PRODUCT_MIN_WEIGHTS):
        return transposed_product(x, weight)
    return F.linear(x, weight)


class LayerLinear(nn.Linear):
    """`nn.Linear` (same parameters, same state_dict) whose inference on a CPU in fp32 takes the transposed
    product at 2..TRANSPOSED_LAYER_MAX_ROWS rows for a weight of at least TRANSPOSED_LAYER_MIN_WEIGHTS
    elements: a verification pass of a few tokens then streams each weight once, as a one-token step does,
    instead of re-packing it (SmolLM2, R = 1, in situ: a 4-token pass cost 1.8x a 1-token pass, now 1.1x).
    Training (autograd), bf16, GPUs and the tiny target's small weights take `F.linear` unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None and transposed_product_pays(
            x, self.weight, TRANSPOSED_LAYER_MIN_WEIGHTS, TRANSPOSED_LAYER_MAX_ROWS
        ):
            return transposed_product(x, self.weight)
        return F.linear(x, self.weight, self.bias)


# the layer projections that take `LayerLinear`: a decoder layer's q/k/v/o and SwiGLU, and a drafter's input
# projections (EAGLE's fuse and w_in, the parallel drafters' W_c); nothing else changes class
LAYER_PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "fuse", "w_in", "ctx_proj")


def fast_on_cpu(model: M) -> M:
    """Swap the CPU speed path into a target (`Transformer`) or a drafter, in place; returns it. Every
    `nn.Linear` named in LAYER_PROJECTIONS becomes a `LayerLinear` (same parameters, same state_dict), and a
    target's LM-head projection (which its drafters' heads call too) becomes `project_to_vocab`. On a GPU, in
    bf16 or under autograd both take `F.linear` as before, so the swap is safe everywhere."""
    for module in model.modules():
        for name in LAYER_PROJECTIONS:
            child = getattr(module, name, None)
            if type(child) is nn.Linear:
                child.__class__ = LayerLinear
        if isinstance(module, Transformer):
            module.project_to_vocab, module.speed_paths = project_to_vocab, PROJECTION_METHOD
    return model
