"""The Markov sequential head for a whole draft block, one program per request (paper §3.1).

DSpark's backbone scores all γ draft slots in one pass (logits U_k, hidden
h_k). The Markov head then walks the block left to right; at step k, with
x_{k-1} the token just drawn (x_0 = the anchor):

    e_k        = W1[x_{k-1}]                            (r,)   a row lookup
    logits_k   = U_k + W2 e_k                           (V,)   the bigram correction
    q_k        = softmax(logits_k / T)                  (V,)   one-hot argmax when T = 0
    x_k        = inverse-CDF draw from q_k with uniforms[k]
    c_k        = σ(w_hᵀ h_k + w_eᵀ e_k + b)                    the confidence head

The steps depend on each other only through x_{k-1}, a single integer, so a
program keeps it in a register and runs the γ steps back to back: one launch
for the batch instead of γ × (lookup, matmul, softmax, sample) PyTorch calls.

Reference: `dspark.drafters.parallel.markov_block_reference`. Given the same uniforms the tokens are the same; the
probabilities and confidences agree to float32 round-off (sums are added in
another order). Greedy ties go to the lowest token id, as in `torch.argmax`.

What this kernel does not do: top-k/top-p (the dispatcher keeps those in
PyTorch), the RNN head, or vocabularies above MAX_VOCAB (one program holds a
whole vocabulary row in registers; a larger vocabulary would need a chunked
two-pass softmax). It reads W2 one rank column at a time through its strides:
with nn.Linear's (V, r) layout those loads are strided; a (r, V)-contiguous
copy, `w2.t().contiguous().t()`, would make them coalesced (untuned: no GPU yet).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dspark_kernels.inverse_cdf import draw_token

MAX_VOCAB = 16384  # largest vocabulary one program handles (a whole row lives in registers)


@triton.jit
def markov_block_kernel(
    base_logits_ptr,  # (R, γ, V) fp32: U, the backbone's logits for every draft slot
    hidden_ptr,  # (R, γ, D) fp32: h, the backbone's hidden state for every slot
    anchors_ptr,  # (R,) int64: x_0, the token before the block
    w1_ptr,  # (V, r): W1, row x is the embedding of previous token x
    w2_ptr,  # (V, r): W2 as nn.Linear(r, V) stores it; logits += W2 @ e
    conf_weight_ptr,  # (D + r,): w = [w_h; w_e] of the confidence head
    conf_bias_ptr,  # (1,): b of the confidence head
    uniforms_ptr,  # (R, γ) fp32 in [0, 1): the uniform that draws token k of request r
    tokens_ptr,  # out (R, γ) int64: x_1..x_γ
    probs_ptr,  # out (R, γ, V) fp32: q_1..q_γ, the distributions the tokens were drawn from
    conf_ptr,  # out (R, γ) fp32: c_1..c_γ
    gamma,  # γ, draft slots per request
    vocab_size,  # V
    hidden_size,  # D
    rank,  # r
    temperature,  # T > 0 (ignored when GREEDY)
    stride_w1,  # elements between rows of W1
    stride_w2_v,  # elements between vocabulary rows of W2
    stride_w2_r,  # elements between rank columns of W2 (1 for nn.Linear's layout)
    GREEDY: tl.constexpr,  # T = 0: q is one-hot on the argmax
    BLOCK_V: tl.constexpr,  # power of two >= V
    BLOCK_D: tl.constexpr,  # power of two >= D
    BLOCK_R: tl.constexpr,  # power of two >= r
):
    request = tl.program_id(0)  # one program walks one request's block
    vocab = tl.arange(0, BLOCK_V)
    dims = tl.arange(0, BLOCK_D)
    ranks = tl.arange(0, BLOCK_R)
    in_vocab, in_dims, in_rank = vocab < vocab_size, dims < hidden_size, ranks < rank

    # the confidence head's weights are the same for every step: load them once
    w_hidden = tl.load(conf_weight_ptr + dims, mask=in_dims, other=0.0)  # (BLOCK_D,)
    w_embed = tl.load(conf_weight_ptr + hidden_size + ranks, mask=in_rank, other=0.0)  # (BLOCK_R,)
    bias = tl.load(conf_bias_ptr)

    prev = tl.load(anchors_ptr + request)  # x_0
    for k in range(gamma):
        slot = request * gamma + k  # row of (R, γ, ·) tensors
        e = tl.load(w1_ptr + prev * stride_w1 + ranks, mask=in_rank, other=0.0)  # (BLOCK_R,) W1[x_{k-1}]

        # logits = U_k + W2 e, one rank column at a time (r small; keeps the tile at (BLOCK_V,))
        logits = tl.load(base_logits_ptr + slot * vocab_size + vocab, mask=in_vocab, other=0.0)
        for j in range(rank):
            e_j = tl.load(w1_ptr + prev * stride_w1 + j)
            column = tl.load(w2_ptr + vocab * stride_w2_v + j * stride_w2_r, mask=in_vocab, other=0.0)
            logits += column * e_j
        logits = tl.where(in_vocab, logits, float("-inf"))

        if GREEDY:
            best = tl.argmax(logits, axis=0, tie_break_left=True)
            probs = tl.where(vocab == best, 1.0, 0.0)
        else:
            if temperature != 1.0:
                logits = logits / temperature
            shifted = tl.exp(logits - tl.max(logits, axis=0))  # 0 beyond V
            probs = shifted / tl.sum(shifted, axis=0)

        uniform = tl.load(uniforms_ptr + slot)
        token = draw_token(probs, vocab, vocab_size, uniform)

        h = tl.load(hidden_ptr + slot * hidden_size + dims, mask=in_dims, other=0.0)  # (BLOCK_D,)
        score = tl.sum(w_hidden * h, axis=0) + tl.sum(w_embed * e, axis=0) + bias
        tl.store(conf_ptr + slot, 1.0 / (1.0 + tl.exp(-score)))
        tl.store(probs_ptr + slot * vocab_size + vocab, probs, mask=in_vocab)
        tl.store(tokens_ptr + slot, token.to(tl.int64))
        prev = token.to(tl.int64)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")


def markov_block_sample_triton(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
    temperature: float,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens (R, γ) int64, probabilities (R, γ, V) fp32 and confidences (R, γ) fp32.

    Same arguments as the reference, with `temperature` for SamplingParams (no
    top-k/top-p). base_logits/hidden/uniforms must be contiguous; W1 needs
    contiguous rows, W2 may have any strides."""
    if base_logits.dim() != 3:
        raise ValueError(f"base_logits must be (R, γ, V), got {tuple(base_logits.shape)}")
    R, gamma, V = base_logits.shape
    D, r, device = hidden.shape[-1], w1.shape[-1], base_logits.device
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"vocabulary {V} outside the kernel's 1..{MAX_VOCAB}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    _check("base_logits", base_logits, (R, gamma, V), torch.float32, device)
    _check("hidden", hidden, (R, gamma, D), torch.float32, device)
    _check("anchors", anchors, (R,), torch.int64, device)
    _check("w1", w1, (V, r), torch.float32, device)
    _check("w2", w2, (V, r), torch.float32, device)
    _check("conf_weight", conf_weight, (D + r,), torch.float32, device)
    _check("conf_bias", conf_bias, (1,), torch.float32, device)
    _check("uniforms", uniforms, (R, gamma), torch.float32, device)
    for name, t in [("base_logits", base_logits), ("hidden", hidden), ("uniforms", uniforms)]:
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if w1.stride(1) != 1 or not conf_weight.is_contiguous():
        raise ValueError("w1 needs contiguous rows and conf_weight must be contiguous")

    tokens = torch.empty(R, gamma, dtype=torch.int64, device=device)
    probs = torch.empty(R, gamma, V, dtype=torch.float32, device=device)
    conf = torch.empty(R, gamma, dtype=torch.float32, device=device)
    if R == 0 or gamma == 0:
        return tokens, probs, conf
    markov_block_kernel[(R,)](
        base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, uniforms,
        tokens, probs, conf,
        gamma, V, D, r, float(temperature) if temperature > 0 else 1.0,
        w1.stride(0), w2.stride(0), w2.stride(1),
        GREEDY=temperature == 0,
        BLOCK_V=triton.next_power_of_2(V),
        BLOCK_D=triton.next_power_of_2(D),
        BLOCK_R=triton.next_power_of_2(r),
    )  # fmt: skip
    return tokens, probs, conf
