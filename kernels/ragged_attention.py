"""Variable-length verify attention against the KV cache, as a Triton kernel (paper §5.3).

One verify step feeds the target a ragged batch: request r brings a block of
b_r tokens (anchor + drafts; a whole prompt at prefill), all N = Σ b_r tokens
flattened into one vector, request-major. `cu_seqlens` (S+1,) says where each
block starts in that vector and `request_ids` (N,) which request each token
belongs to. Before attention runs, the caller has already written every
block's own keys/values into its cache slot, so for token n of request r

    pos      = starts[r] + (n - cu_seqlens[r])        (its absolute position)
    out[n,h] = softmax(q[n,h] · K[slot, :pos+1]ᵀ / √hd) · V[slot, :pos+1]

with slot = slots[r] and K, V the kv head h // (H // Hkv) (grouped-query
attention, as `enable_gqa` in SDPA): everything in the cache before the block,
plus the block causally up to the token itself.

The reference is `dspark.model.ragged_attention_reference` (imported below as
`reference`): it pads every block to the longest one and runs SDPA with a
mask. This kernel needs no padding and no mask tensor: one program per
(query token, query head) walks the keys 0..pos in tiles of BLOCK_N with an
online softmax (running max, running sum, rescaled accumulator), in fp32.

What this file does not do: write the cache (the caller does), paged or
non-contiguous caches, share key tiles between the tokens of one block or the
heads of one kv group (each program reloads them; a FlashAttention-style
query tile would), or split long contexts across programs (flash-decoding).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dspark.model import ragged_attention_reference as reference  # noqa: F401  (the ground truth)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _ragged_attention_kernel(
    q_ptr,  # (N, H, hd) queries, flat over all requests
    k_ptr,  # (n_slots_total, Hkv, T_max, hd) one layer of the key cache
    v_ptr,  # (n_slots_total, Hkv, T_max, hd) one layer of the value cache
    out_ptr,  # (N, H, hd) output, q's dtype
    slots_ptr,  # (S,) int: cache slot of request r
    starts_ptr,  # (S,) int: cache length of request r before its block
    cu_seqlens_ptr,  # (S+1,) int: flat index of the first token of request r's block
    request_ids_ptr,  # (N,) int: request r of flat token n
    stride_qn,  # strides of q, in elements: token, head, feature
    stride_qh,
    stride_qd,
    stride_ks,  # strides of the key cache: slot, kv head, position, feature
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vs,  # strides of the value cache, same order
    stride_vh,
    stride_vt,
    stride_vd,
    stride_on,  # strides of out: token, head, feature
    stride_oh,
    stride_od,
    sm_scale,  # fp32: 1 / sqrt(hd)
    GROUP: tl.constexpr,  # H // Hkv: query heads sharing one kv head
    HEAD_DIM: tl.constexpr,  # hd, the real feature count
    BLOCK_D: tl.constexpr,  # next power of two >= hd; lanes beyond hd are masked off
    BLOCK_N: tl.constexpr,  # keys per tile of the loop
):
    """Program (n, h): the attention output of flat token n, query head h."""
    n = tl.program_id(0)
    h = tl.program_id(1)

    # Which request, which cache slot, and which absolute position this token has.
    r = tl.load(request_ids_ptr + n)
    slot = tl.load(slots_ptr + r)
    pos = tl.load(starts_ptr + r) + (n - tl.load(cu_seqlens_ptr + r))
    kv_head = h // GROUP

    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + n * stride_qn + h * stride_qh + offs_d * stride_qd, mask=d_mask, other=0.0)
    q = q.to(tl.float32) * sm_scale  # (BLOCK_D,) scaled once instead of every score

    k_base = k_ptr + slot * stride_ks + kv_head * stride_kh
    v_base = v_ptr + slot * stride_vs + kv_head * stride_vh

    # Online softmax state: running max m, running sum l of exp(score - m), and
    # acc = Σ exp(score - m) · v. When m grows, the old l and acc are rescaled.
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for tile_start in range(0, pos + 1, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions of this tile
        n_mask = offs_n <= pos  # keys after the token (or past the block) are not seen
        tile_mask = n_mask[:, None] & d_mask[None, :]  # (BLOCK_N, BLOCK_D)
        k_ptrs = k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd  # (BLOCK_N, BLOCK_D)
        k = tl.load(k_ptrs, mask=tile_mask, other=0.0)
        scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1)  # (BLOCK_N,)
        scores = tl.where(n_mask, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))  # finite: key 0 is in the first tile
        alpha = tl.exp(m_i - m_new)  # 0 on the first tile (m_i = -inf)
        p = tl.exp(scores - m_new)  # (BLOCK_N,), 0 on masked keys
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
        v = tl.load(v_ptrs, mask=tile_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)  # (BLOCK_D,)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new

    out = acc / l_i
    out_ptrs = out_ptr + n * stride_on + h * stride_oh + offs_d * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def ragged_verify_attention(
    q: torch.Tensor,
    layer_keys: torch.Tensor,
    layer_values: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    cu_seqlens: torch.Tensor,
    request_ids: torch.Tensor,
    *,
    block_n: int = 64,
) -> torch.Tensor:
    """Attention of flat ragged queries against their requests' cache slots.

    q (N, H, hd) fp32/fp16/bf16; layer_keys, layer_values (n_slots_total, Hkv,
    T_max, hd), one float dtype for both (it may differ from q's); slots,
    starts (S,), cu_seqlens (S+1,), request_ids (N,) int32/int64, as built by
    `dspark.model.RaggedIndex`. The caller guarantees starts[r] + block length
    <= T_max and that the block's keys are in the cache. Returns out (N, H, hd)
    in q's dtype. `block_n` (a power of two) is the key tile length."""
    if q.dim() != 3 or layer_keys.dim() != 4 or layer_values.shape != layer_keys.shape:
        raise ValueError(
            "q must be (N, H, hd) and layer_keys/layer_values both (n_slots_total, Hkv, T_max, hd), got "
            f"{tuple(q.shape)}, {tuple(layer_keys.shape)}, {tuple(layer_values.shape)}"
        )
    N, H, hd = q.shape
    S, Hkv = slots.shape[0], layer_keys.shape[1]
    if layer_keys.shape[3] != hd or H % Hkv != 0:
        raise ValueError(f"head_dim {hd} vs {layer_keys.shape[3]}, or H={H} not a multiple of Hkv={Hkv}")
    index_shapes = {"slots": (S,), "starts": (S,), "cu_seqlens": (S + 1,), "request_ids": (N,)}
    index = {"slots": slots, "starts": starts, "cu_seqlens": cu_seqlens, "request_ids": request_ids}
    for name, t in index.items():
        if tuple(t.shape) != index_shapes[name]:
            raise ValueError(f"{name} must have shape {index_shapes[name]}, got {tuple(t.shape)}")
        if t.dtype not in _INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if q.dtype not in _FLOAT_DTYPES or layer_keys.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q and the cache must be fp32, fp16 or bf16, got {q.dtype} and {layer_keys.dtype}")
    if layer_values.dtype != layer_keys.dtype:
        raise ValueError(f"layer_keys is {layer_keys.dtype} but layer_values {layer_values.dtype}")
    tensors = {"q": q, "layer_keys": layer_keys, "layer_values": layer_values, **index}
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: all inputs must share a device")
    if block_n < 1 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two, got {block_n}")

    out = torch.empty_like(q)  # (N, H, hd)
    if N == 0:
        return out
    _ragged_attention_kernel[(N, H)](
        q, layer_keys, layer_values, out,
        slots, starts, cu_seqlens, request_ids,
        *q.stride(), *layer_keys.stride(), *layer_values.stride(), *out.stride(),
        1.0 / math.sqrt(hd),
        GROUP=H // Hkv,
        HEAD_DIM=hd,
        BLOCK_D=triton.next_power_of_2(hd),
        BLOCK_N=block_n,
    )  # fmt: skip
    return out
