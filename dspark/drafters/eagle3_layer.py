"""EAGLE-3's own decoder layer (the "midlayer" of its checkpoints), an option of the EAGLE drafter.

The EAGLE drafter's default layer is the target's pre-norm Llama block over one
entry vector, W_in [RMSNorm(emb(x_{i+1})); RMSNorm(g_i)]. EAGLE-3 as vLLM and
SGLang run it (`llama_eagle3.py`) has no W_in; its one layer reads the two
halves directly and adds the attention output to the feature itself:

    a   = Attention([RMSNorm_in(emb(x_{i+1})); RMSNorm_hidden(g_i)])   (2·dim -> dim)
    r   = g_i + a                                                      (the feature is the residual)
    out = r + SwiGLU(RMSNorm_post(r))                                  (fed back as g_{i+1}, pre-norm)

No RMSNorm of the concatenation itself: q, k and v read the 2·dim vector as it
is. So that the shared loops (`run_blocks_cached`, training's `_layer_step`) can
run it beside plain blocks, its input x packs the three vectors side by side,
[RMSNorm_in(emb); RMSNorm_hidden(g); g] (..., 3·dim): `attention_input` is the
first 2·dim, `residual` the last dim -- the two methods a `Block` answers with
RMSNorm(x) and x. The two input norms stay the drafter's own `token_norm` and
`feature_norm` (EAGLE-3's `input_layernorm` and `hidden_norm`).

What this file does not do: the drafter around it (autoregressive.py) or the
export to the EAGLE-3 layout (dspark/lab/exporting/eagle3.py).
"""

from __future__ import annotations

import torch
from torch import nn

from dspark.config import ModelConfig
from dspark.model import Attention, FeedForward, RMSNorm


class Eagle3Layer(nn.Module):
    """The EAGLE-3 decoder layer over packed inputs [norm(emb); norm(g); g] (..., 3·dim) -> (..., dim)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dim = config.dim
        self.attn = Attention(config, in_dim=2 * config.dim)  # q/k/v: 2·dim -> heads, o: dim -> dim
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)  # post_attention_layernorm
        self.ffn = FeedForward(config)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 3·dim) -> (..., 2·dim): the two normed halves, as they are."""
        return x[..., : 2 * self.dim]

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 3·dim) -> (..., dim): the raw feature g, what the attention output is added to."""
        return x[..., 2 * self.dim :]


def pack_inputs(
    token_normed: torch.Tensor, feature_normed: torch.Tensor, feature: torch.Tensor
) -> torch.Tensor:
    """[RMSNorm_in(emb); RMSNorm_hidden(g); g], each (..., dim), side by side: (..., 3·dim)."""
    return torch.cat(
        [token_normed, feature_normed.to(token_normed.dtype), feature.to(token_normed.dtype)], -1
    )
