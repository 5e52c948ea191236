"""The CPU speed paths, as ONE swap applied to a plain model: x Wᵀ of a few rows computed as (W xᵀ)ᵀ, and
attention that pads less, copies fewer keys and skips torch's slow bf16 SDPA.

The paper's premise -- verifying ℓ + 1 tokens costs about what decoding one does -- needs every matmul of a
few rows to stream its weight once. In fp32 on a CPU `F.linear` does that for one row (the matrix-vector
path) but re-packs the whole weight for a matrix product from two rows on. `VocabHead` (LM heads, by
`project_to_vocab`) and `LayerLinear` (decoder-layer projections) take the transposed product instead where
that was measured to pay. The same sums in another order: equal to `F.linear` up to fp32 rounding
(walkthrough/DESIGN.md §8). `CPUAttention` computes what the core's `Attention` does, but a pass of long
blocks beside short ones attends part by part (`by_request`), slots that fill a range read the cache as a
view, and bf16/fp16 take `grouped_attention`. `fast_on_cpu` swaps these subclasses into a core model or
drafter (the core itself is plain `nn.Linear`, `F.linear` and SDPA), as gpt-fast's quantize.py swaps
`nn.Linear`; the lab's loaders (`cli.load_target`, `exported.get_drafter`) apply it, so every command runs
with it.

What this file does not do: anything on a GPU (the core's paths, the attention kernel included), or change a
projection in bf16 or under autograd (`F.linear`, unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.kv_cache import KVCache
from dspark.model import Attention, RaggedIndex, Transformer, masked_attention, ragged_attention
from dspark_kernels import use_kernel

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
# rows computed as more rows: on the 2-core AVX2 EPYC a SmolLM2 pass over 3 tokens cost 65.7 ms against 59.5
# ms over 4 (the layers' 576 x 1536 products 0.33 ms at 3 rows, 0.27 at 4); padded, 3 tokens took 58.1 ms. (At
# 5 rows padding to 6 cost more, at 7 nothing; the weights are streamed once whatever the rows, so a row
# more costs next to nothing where the kernel is no faster.)
PADDED_ROWS = {3: 4}
# how these projections compute, named in the keys of cached step timings (a change re-measures them)
PROJECTION_METHOD = (
    f"(W xT)T on cpu fp32: heads from {TRANSPOSED_PRODUCT_MIN_WEIGHTS} weights, layers from "
    f"{TRANSPOSED_LAYER_MIN_WEIGHTS} weights at 2..{TRANSPOSED_LAYER_MAX_ROWS} rows, rows padded {PADDED_ROWS}; "
    "else F.linear"
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
    against 8). Three rows are computed as four (PADDED_ROWS)."""
    flat = x.reshape(-1, x.shape[-1])  # (n, in)
    n = flat.shape[0]
    if n in PADDED_ROWS:  # one row more runs a faster kernel: the extra column is computed and dropped
        flat = torch.cat([flat, flat.new_zeros(PADDED_ROWS[n] - n, flat.shape[1])])
    return torch.mm(weight, flat.T)[:, :n].T.contiguous().view(*x.shape[:-1], weight.shape[0])  # (..., out)


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


class VocabHead(nn.Linear):
    """An LM head (`nn.Linear` without bias: same parameters, same state_dict) whose logits are
    `project_to_vocab`: what the target's `lm_head(x)` computes, for itself and for its drafters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project_to_vocab(x, self.weight)


def projection_method(target: Transformer) -> str:
    """How `target`'s projections compute (PROJECTION_METHOD once swapped, else "F.linear"), for the keys of
    cached step timings."""
    return PROJECTION_METHOD if isinstance(target.lm_head, VocabHead) else "F.linear"


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


# blocks this long are prefills, where attending part by part can pay (`by_request`)
BY_REQUEST_MIN_BLOCK = 16


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`masked_attention` written out: q (S, Tb, H, hd), keys/values (S, Hkv, L, hd), mask (S, 1, Tb, L) True =
    visible -> (S, Tb, H, hd). Scores and softmax in fp32.

    For bf16 on a CPU: there torch's SDPA kernel parallelises a one-token query badly (batch 16 decode: 2.5 ms
    a layer against 0.25 ms written out, measured on this 2-core machine)."""
    S, Tb, H, hd = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    g = H // Hkv  # query heads per key/value head
    q = q.view(S, Tb, Hkv, g, hd).permute(0, 2, 3, 1, 4).reshape(S, Hkv, g * Tb, hd)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float().mul_(hd**-0.5).view(S, Hkv, g, Tb, L)
    scores = scores.masked_fill_(~mask[:, :, None], float("-inf"))  # mask (S, 1, 1, Tb, L)
    weights = torch.softmax(scores, dim=-1).to(values.dtype).view(S, Hkv, g * Tb, L)
    out = torch.matmul(weights, values).view(S, Hkv, g, Tb, hd)
    return out.permute(0, 3, 1, 2, 4).reshape(S, Tb, H, hd)


def masked_attention_on_cpu(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The core's `masked_attention` (same arguments), by `grouped_attention` for bf16/fp16 inference on a CPU."""
    half = q.dtype in (torch.bfloat16, torch.float16)
    if half and q.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):  # inference: no autocast
        return grouped_attention(q, keys.to(q.dtype), values.to(q.dtype), mask)
    return masked_attention(q, keys, values, mask)


@dataclass
class Part:
    """One attention call of a pass on the CPU: the index of some of its blocks, their flat tokens (N_p,) (None:
    all), the first slot when the slots fill a range in any order (their keys are then a view of the cache, row
    slots[r] - first for request r; else gathered in request order), each token's row (N_p,), the mask by row."""

    rb: RaggedIndex
    tokens: torch.Tensor | None
    first: int | None
    token_row: torch.Tensor
    mask: torch.Tensor


def part(rb: RaggedIndex, tokens: torch.Tensor | None = None) -> Part:
    """The `Part` of index `rb`: read as a view when its slots fill a range (every step of a full batch, as
    requests finish and are replaced in any order), which saves copying every slot's keys every layer."""
    slots = rb.slots.tolist()  # a CPU tensor: no device sync
    first = min(slots)
    if sorted(slots) != list(range(first, first + len(slots))):
        return Part(rb, tokens, None, rb.slot_index, rb.mask)
    row = rb.slots - first  # (S,) request r's row of the view
    mask = torch.empty_like(rb.mask)
    mask[row] = rb.mask
    return Part(rb, tokens, first, row[rb.slot_index], mask)


def by_request(rb: RaggedIndex, context: int) -> list[Part]:
    """The parts a pass attends by: itself, or, where padding every block to the longest would cost over twice
    the query-key pairs its requests need (a prefill of prompts of unequal lengths; prompts beside verify
    blocks), each block of >= BY_REQUEST_MIN_BLOCK tokens alone and the shorter ones padded together."""
    lens, starts, first = rb.block_lens.tolist(), rb.starts.tolist(), rb.cu_seqlens.tolist()  # CPU: no sync
    useful = sum(n * (s + n) for n, s in zip(lens, starts))
    S = len(lens)
    if rb.block_max < BY_REQUEST_MIN_BLOCK or S == 1 or S * rb.block_max * rb.kv_len <= 2 * useful:
        return [part(rb)]
    groups = [[r] for r in range(S) if lens[r] >= BY_REQUEST_MIN_BLOCK]  # each long block
    short = [r for r in range(S) if lens[r] < BY_REQUEST_MIN_BLOCK]
    parts = []
    for rows in groups + ([short] if short else []):
        at = torch.tensor(rows)
        tokens = torch.tensor([t for r in rows for t in range(first[r], first[r + 1])])  # (N_p,)
        parts.append(part(RaggedIndex.build(rb.slots[at], rb.block_lens[at], rb.starts[at], context), tokens))
    return parts


def attend_part(
    q: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor, p: Part
) -> torch.Tensor:
    """The core's `ragged_attention_reference` over one part, its keys read by row: q (N_p, H, hd) -> the same."""
    rb = p.rb
    at = slice(p.first, p.first + len(rb.slots)) if p.first is not None else rb.slots
    keys = layer_keys[at, :, : rb.kv_len]  # (S, Hkv, L, hd)
    values = layer_values[at, :, : rb.kv_len]
    q_pad = q.new_zeros(len(rb.slots), rb.block_max, *q.shape[1:])  # (S, Tb, H, hd), rows as keys
    q_pad[p.token_row, rb.offsets] = q
    out = masked_attention_on_cpu(q_pad, keys.to(q.dtype), values.to(q.dtype), p.mask)
    return out[p.token_row, rb.offsets]  # (N_p, H, hd)


# the last pass's index and its parts: `by_request` runs once a pass, not once a layer
_last_pass: tuple[RaggedIndex, list[Part]] | None = None


def parts_of(rb: RaggedIndex, context: int) -> list[Part]:
    """`by_request(rb, context)`, found at a pass's first layer and kept for its others."""
    global _last_pass
    if _last_pass is None or _last_pass[0] is not rb:
        _last_pass = (rb, by_request(rb, context))
    return _last_pass[1]


def ragged_attention_on_cpu(
    q: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor, rb: RaggedIndex
) -> torch.Tensor:
    """The core's `ragged_attention` (same arguments and result): the kernel or, off the CPU, the core's path
    as they are; on the CPU the pass's `by_request` parts (`parts_of`), each by `attend_part`."""
    if q.device.type != "cpu" or use_kernel(q, layer_keys, layer_values):
        return ragged_attention(q, layer_keys, layer_values, rb)
    parts = parts_of(rb, layer_keys.shape[2])
    if len(parts) == 1:
        return attend_part(q, layer_keys, layer_values, parts[0])
    out = torch.empty_like(q)
    for p in parts:
        out[p.tokens] = attend_part(q[p.tokens], layer_keys, layer_values, p)
    return out


class CPUAttention(Attention):
    """The core's `Attention` (same parameters, same state_dict) attending through `ragged_attention_on_cpu`
    (cached passes) and `masked_attention_on_cpu` (a drafter's blocks); its causal `forward` is the core's."""

    def forward_cached(
        self, x: Tensor, cos: Tensor, sin: Tensor, layer: int, cache: KVCache, rb: RaggedIndex
    ) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # (N, H, hd), (N, Hkv, hd), (N, Hkv, hd)
        cache.keys[layer][rb.token_slot, :, rb.positions] = k.to(cache.keys.dtype)
        cache.values[layer][rb.token_slot, :, rb.positions] = v.to(cache.values.dtype)
        out = ragged_attention_on_cpu(q, cache.keys[layer], cache.values[layer], rb)  # (N, H, hd)
        return self.wo(out.reshape(x.shape[0], -1))

    def forward_masked(
        self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor
    ) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # (R, S, H|Hkv, hd)
        keys = torch.cat([ctx_k, k.transpose(1, 2)], dim=2)  # (R, Hkv, L + S, hd)
        values = torch.cat([ctx_v, v.transpose(1, 2)], dim=2)
        return self.wo(masked_attention_on_cpu(q, keys, values, mask).flatten(2))


# the layer projections that take `LayerLinear`: a decoder layer's q/k/v/o and SwiGLU, and a drafter's input
# projections (EAGLE's fuse and w_in, the parallel drafters' W_c); nothing else changes class
LAYER_PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "fuse", "w_in", "ctx_proj")


def fast_on_cpu(model: M) -> M:
    """Swap the CPU speed path into a target (`Transformer`) or a drafter, in place; returns it: every
    `nn.Linear` named in LAYER_PROJECTIONS becomes a `LayerLinear`, a target's `lm_head` (which its
    drafters' heads call too) a `VocabHead`, every `Attention` a `CPUAttention` (the same parameters and
    state_dict). On a GPU, in bf16 or under autograd the projections take `F.linear`, and on a GPU attention
    the core's path, so the swap is safe everywhere."""
    for module in model.modules():
        if type(module) is Attention:
            module.__class__ = CPUAttention
        for name in LAYER_PROJECTIONS:
            child = getattr(module, name, None)
            if type(child) is nn.Linear:
                child.__class__ = LayerLinear
        if isinstance(module, Transformer) and type(module.lm_head) is nn.Linear:
            module.lm_head.__class__ = VocabHead
    return model
