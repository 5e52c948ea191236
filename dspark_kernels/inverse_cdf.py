"""Drawing one token from a probability row with a given uniform, as a Triton device function.

Both samplers in this package end the same way: a probability row over the
vocabulary and one uniform u in [0, 1) in, one token id out. The rule is the
one `dspark.sampling.sample_from_probs` (the reference) implements, restated:

    cdf   = cumsum(probs)                    (unnormalised; total = cdf[V-1])
    token = #{v : cdf[v] <= u · total}        (searchsorted, right-sided ties)
    if token == V or probs[token] == 0:       (u · total rounded onto the end)
        token = min(token, last v with probs[v] > 0)

so a token of probability zero is never drawn. Kernel and reference see the
same uniforms, hence draw the same token; the only difference is the order in
which the cumulative sum is added up (a parallel scan here, a sequential loop
in PyTorch), which can move a boundary by a few ulps: a uniform would have to
land within ~1e-7 of a boundary for the two to disagree.

What this file does not do: temperature, softmax or residuals (the callers).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def draw_token(probs, vocab_offsets, vocab_size, uniform):
    """One token id (int32 scalar) from a probability row.

    probs          (BLOCK_V,) fp32 tile, zero beyond `vocab_size`
    vocab_offsets  (BLOCK_V,) int32, tl.arange(0, BLOCK_V): the token id of each lane
    vocab_size     V, the number of real lanes
    uniform        fp32 scalar in [0, 1)
    """
    in_vocab = vocab_offsets < vocab_size
    cdf = tl.cumsum(probs, axis=0)  # (BLOCK_V,)
    total = tl.sum(tl.where(vocab_offsets == vocab_size - 1, cdf, 0.0), axis=0)  # cdf[V-1]
    threshold = uniform * total
    token = tl.sum((in_vocab & (cdf <= threshold)).to(tl.int32), axis=0)
    chosen = tl.sum(tl.where(vocab_offsets == tl.minimum(token, vocab_size - 1), probs, 0.0), axis=0)
    last_positive = tl.max(tl.where(in_vocab & (probs > 0), vocab_offsets, -1), axis=0)
    stray = (token >= vocab_size) | (chosen <= 0)
    return tl.where(stray, tl.minimum(token, last_positive), token)
