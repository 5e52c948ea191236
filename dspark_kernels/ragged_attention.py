"""Variable-length verify attention against the KV cache, as a Triton kernel (paper §5.3).

One verify step feeds the target a ragged batch: request r brings a block of
b_r tokens (anchor + drafts; a whole prompt at prefill), all N = Σ b_r tokens
flattened into one vector, request-major. `cu_seqlens` (S+1,) says where each
block starts in that vector (b_r = cu_seqlens[r+1] - cu_seqlens[r]). Before
attention runs, the caller has already written every block's own keys/values
into its cache slot, so for token n of request r

    pos      = starts[r] + (n - cu_seqlens[r])        (its absolute position)
    out[n,h] = softmax(q[n,h] · K[slot, :pos+1]ᵀ / √hd) · V[slot, :pos+1]

with slot = slots[r] and K, V the kv head h // (H // Hkv) (grouped-query
attention, as `enable_gqa` in SDPA): everything in the cache before the block,
plus the block causally up to the token itself.

The reference is `dspark.model.ragged_attention_reference`: it gathers the slots' keys, pads every block to the
longest one and runs SDPA with a mask. This kernel needs no padding of q and no mask tensor. It uses the
FlashAttention "varlen" layout: one program per (request, query head, query
tile). Program (r, h, m) takes the queries m·BLOCK_M .. m·BLOCK_M + BLOCK_M - 1
of request r's block (rows past the block's end are masked) and walks the keys
of slot slots[r] from 0 to its last query's position in tiles of BLOCK_N, with
an online softmax per query row (running max, running sum, rescaled
accumulator), in fp32. Each key tile is loaded once for the whole query tile,
so a verify block of γ + 1 tokens reads its context once, not γ + 1 times.
The causal rule is key_pos <= query_pos, tile by tile. QKᵀ and PV are
`tl.dot` when every tile dimension is >= 16 (its minimum; fp32 "ieee"
precision, so no TF32 on a GPU), else a broadcast multiply and a sum.

What this file does not do: write the cache (the caller does), paged or
non-contiguous caches, share key tiles between the heads of one kv group
(each query head's program loads them again), or split long contexts across
programs (split-K / flash-decoding): one program walks its whole context.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_MIN_DOT = 16  # tl.dot needs every tile dimension >= 16


@triton.jit
def _ragged_attention_kernel(
    q_ptr,  # (N, H, hd) queries, flat over all requests
    k_ptr,  # (n_slots_total, Hkv, T_max, hd) one layer of the key cache
    v_ptr,  # (n_slots_total, Hkv, T_max, hd) one layer of the value cache
    out_ptr,  # (N, H, hd) output, q's dtype
    slots_ptr,  # (S,) int: cache slot of request r
    starts_ptr,  # (S,) int: cache length of request r before its block
    cu_seqlens_ptr,  # (S+1,) int: flat index of the first token of request r's block
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
    BLOCK_M: tl.constexpr,  # queries per program (a tile of one request's block)
    BLOCK_N: tl.constexpr,  # keys per tile of the loop
    BLOCK_D: tl.constexpr,  # power of two >= hd; lanes beyond hd are masked off
    USE_DOT: tl.constexpr,  # tiles are all >= 16: multiply them with tl.dot
):
    """Program (r, h, m): query tile m of request r's block, query head h."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    m = tl.program_id(2)

    # The block of request r: flat tokens first .. first + block_len - 1, at
    # absolute positions start .. start + block_len - 1 of cache slot `slot`.
    first = tl.load(cu_seqlens_ptr + r)
    block_len = tl.load(cu_seqlens_ptr + r + 1) - first
    if m * BLOCK_M >= block_len:
        return  # the grid is sized for the longest block; this one is shorter
    slot = tl.load(slots_ptr + r)
    start = tl.load(starts_ptr + r)
    kv_head = h // GROUP

    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) indices inside the block
    m_mask = offs_m < block_len  # rows past the block's end: computed, never stored
    q_pos = start + offs_m  # (BLOCK_M,) absolute positions of the queries
    offs_d = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    d_mask = offs_d < HEAD_DIM

    q_ptrs = q_ptr + (first + offs_m)[:, None] * stride_qn + h * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    q = q.to(tl.float32) * sm_scale  # scaled once instead of every score

    k_base = k_ptr + slot * stride_ks + kv_head * stride_kh
    v_base = v_ptr + slot * stride_vs + kv_head * stride_vh
    # Keys 0 .. hi - 1: up to the tile's last real query (the cache beyond is not ours to read).
    hi = start + tl.minimum(block_len, (m + 1) * BLOCK_M)

    # Online softmax state, one entry per query row: running max m_i, running
    # sum l_i of exp(score - m_i), and acc = Σ exp(score - m_i) · v. When a
    # row's max grows, its old l_i and acc are rescaled by exp(old - new).
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for tile_start in range(0, hi, BLOCK_N):
        offs_n = tile_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions of this tile
        n_mask = offs_n < hi
        # Kᵀ tile (BLOCK_D, BLOCK_N): feature-major so that q @ kᵀ is a plain matmul.
        kt_ptrs = k_base + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd
        kt = tl.load(kt_ptrs, mask=d_mask[:, None] & n_mask[None, :], other=0.0)
        kt = kt.to(tl.float32)
        if USE_DOT:  # "ieee": fp32 products, not TF32 (the GPU default for fp32 tl.dot)
            scores = tl.dot(q, kt, input_precision="ieee")  # (BLOCK_M, BLOCK_N)
        else:  # the same product as a broadcast multiply and a sum over the features
            scores = tl.sum(q[:, :, None] * kt[None, :, :], axis=1)  # (BLOCK_M, BLOCK_N)
        # Causal: a query sees keys at or before its own position. n_mask also
        # bounds the masked rows past the block, whose positions lie beyond hi.
        seen = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]  # (BLOCK_M, BLOCK_N)
        scores = tl.where(seen, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # (BLOCK_M,) finite: every row sees key 0
        alpha = tl.exp(m_i - m_new)  # (BLOCK_M,) 0 on the first tile (m_i = -inf)
        p = tl.exp(scores - m_new[:, None])  # (BLOCK_M, BLOCK_N), 0 on unseen keys
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
        v = tl.load(v_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        v = v.to(tl.float32)
        if USE_DOT:
            pv = tl.dot(p, v, input_precision="ieee")  # (BLOCK_M, BLOCK_D)
        else:
            pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # (BLOCK_M, BLOCK_D)
        acc = acc * alpha[:, None] + pv
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    out = acc / l_i[:, None]  # (BLOCK_M, BLOCK_D)
    out_ptrs = out_ptr + (first + offs_m)[:, None] * stride_on + h * stride_oh + offs_d[None, :] * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


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
    block_m: int = 16,
    max_block_len: int | None = None,
) -> torch.Tensor:
    """Attention of flat ragged queries against their requests' cache slots.

    q (N, H, hd) fp32/fp16/bf16; layer_keys, layer_values (n_slots_total, Hkv,
    T_max, hd), one float dtype for both (it may differ from q's); slots,
    starts (S,), cu_seqlens (S+1,), request_ids (N,) int32/int64, as built by
    `dspark.model.RaggedIndex.build`. The caller guarantees starts[r] + block length
    <= T_max and that the block's keys are in the cache. Returns out (N, H, hd)
    in q's dtype. `block_n` and `block_m` (powers of two) are the key and query
    tile lengths; when both are >= 16 the tiles are multiplied with tl.dot.
    `max_block_len`, the longest block, sizes the grid; pass it when it is
    known on the host (`RaggedIndex.block_max`), else it is read from cu_seqlens.

    The grid is per request (cu_seqlens says where each block is), so the
    kernel never reads `request_ids`; it stays in the signature (dspark.model
    passes it) and is only validated."""
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
    for name, b in (("block_n", block_n), ("block_m", block_m)):
        if b < 1 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two, got {b}")

    out = torch.empty_like(q)  # (N, H, hd)
    if N == 0:
        return out
    if max_block_len is None:  # read from the device: one device→host sync
        max_block_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    grid = (S, H, triton.cdiv(max_block_len, block_m))
    _ragged_attention_kernel[grid](
        q, layer_keys, layer_values, out,
        slots, starts, cu_seqlens,
        *q.stride(), *layer_keys.stride(), *layer_values.stride(), *out.stride(),
        1.0 / math.sqrt(hd),
        GROUP=H // Hkv,
        HEAD_DIM=hd,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(_MIN_DOT, triton.next_power_of_2(hd)),
        USE_DOT=block_m >= _MIN_DOT and block_n >= _MIN_DOT,
    )  # fmt: skip
    return out
