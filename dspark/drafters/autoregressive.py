"""Feature-conditioned autoregressive drafters: MTP-1 and the EAGLE-3 style drafter.

Both read the target's features at position i together with the token at
position i+1 and predict the token at i+2, through ONE small decoder layer
that has its own KV cache, and the target's frozen embedding and LM head:

    entry_i = W_in [ RMSNorm(emb(x_{i+1})) ; RMSNorm(feature_i) ]   (dim)
    g_i     = DecoderLayer(entry_i | earlier entries)               (dim)
    q       = softmax(LMHead(RMSNorm(g_i)) / T)                     -> x_{i+2}

* MTP-1 (DeepSeek-V3): feature_i = the target's final hidden state; one draft per round.
* EAGLE-3: feature_i = a learned fusion of the tap layers; γ drafts one after another, its own output g
  fed back as the feature of the position it drafted (`eagle3_layer`: EAGLE-3's own layer, `Eagle3Layer`).

Entries built from its own drafts are rolled back at the next call. Each ragged pass reads its shapes
on the host once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.kv_cache import KVCache
from dspark.model import (
    Attention,
    Block,
    FeedForward,
    ModelConfig,
    RaggedIndex,
    RMSNorm,
    Transformer,
    rope_table,
    run_blocks_cached,
)
from dspark.sampling import SamplingParams, probabilities, sample


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer (no W_in): a = Attention([norm(emb); norm(g)]), r = g + a,
    out = r + SwiGLU(norm(r)). Its input packs [norm(emb); norm(g); g] (..., 3·dim) so the shared loops
    run it like a `Block`: `attention_input` / `residual` play RMSNorm(x) / x."""

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


@dataclass
class AutoregressiveDrafterConfig:
    kind: str = "eagle"  # "mtp" (final hidden, 1 token) or "eagle" (fused tap layers, γ tokens)
    max_gamma: int = 7  # longest block it may draft (MTP: 1)
    n_layers: int = 1  # decoder layers of the drafter
    ffn_hidden: int = 688  # SwiGLU width of its decoder layer
    draft_vocab: int = 0  # K > 0: the lab's reduced vocabulary of K ids (dspark/lab/draft_vocab.py); 0 = all
    eagle3_layer: bool = False  # eagle: EAGLE-3's own layer (`Eagle3Layer`: no W_in, 2·dim attention input)

    def __post_init__(self) -> None:
        if self.kind not in ("mtp", "eagle"):
            raise ValueError(f"kind must be 'mtp' or 'eagle', got {self.kind!r}")
        if self.kind == "mtp" and self.max_gamma != 1:
            raise ValueError("MTP-1 drafts exactly one token (max_gamma = 1)")
        if self.eagle3_layer and (self.kind != "eagle" or self.n_layers != 1):
            raise ValueError("the EAGLE-3 layer is one layer of the eagle kind (n_layers = 1)")
        for name in ("max_gamma", "n_layers", "ffn_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


class AutoregressiveDrafter(Drafter):
    def __init__(self, target: Transformer, config: AutoregressiveDrafterConfig) -> None:
        super().__init__()
        tc = target.config
        self.config, self.name, self.max_gamma = config, config.kind, config.max_gamma
        self.layer_config = tc.drafter_layers(config.n_layers, config.ffn_hidden, config.max_gamma + 1)
        n_feat = len(tc.tap_layers) if config.kind == "eagle" else 1
        self.fuse = nn.Linear(n_feat * tc.dim, tc.dim, bias=False) if n_feat > 1 else nn.Identity()
        self.token_norm = RMSNorm(tc.dim, tc.norm_eps)
        self.feature_norm = RMSNorm(tc.dim, tc.norm_eps)
        if config.eagle3_layer:  # [norm(emb); norm(g)] feeds the attention directly, g is the residual
            self.layers = nn.ModuleList([Eagle3Layer(self.layer_config)])
        else:
            self.w_in = nn.Linear(2 * tc.dim, tc.dim, bias=False)
            self.layers = nn.ModuleList(Block(self.layer_config) for _ in range(config.n_layers))
        self.out_norm = RMSNorm(tc.dim, tc.norm_eps)
        cos, sin = rope_table(self.layer_config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._target = (target,)  # frozen, shared; kept out of state_dict
        self.cache: KVCache | None = None
        self.committed: torch.Tensor | None = None  # (n_slots,) entries made from target features
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    @property
    def target(self) -> Transformer:
        return self._target[0]

    # ---- the network -------------------------------------------------------------
    def features_of(self, features: TargetFeatures) -> torch.Tensor:
        """(N, dim) drafter feature for each position from the target's outputs."""
        if self.config.kind == "mtp":
            return features.last_hidden
        return self.fuse(features.flat())  # (N, n_feat * dim) -> (N, dim)

    def entries(self, next_tokens: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """entry_i (N, dim) from the token at i+1 (N,) and the feature at i (N, dim); with the EAGLE-3 layer
        its packed input (N, 3·dim) instead (`Eagle3Layer`)."""
        emb = self.target.embed(next_tokens)
        if self.config.eagle3_layer:
            return pack_inputs(self.token_norm(emb), self.feature_norm(feature), feature)
        return self.w_in(torch.cat([self.token_norm(emb), self.feature_norm(feature)], dim=-1))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., V): the target's frozen LM head."""
        return self.target.lm_head(self.out_norm(g))

    def next_token(
        self, g: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x ~ q = softmax(LMHead(RMSNorm(g)) / T): (x (R,), q (R, V) fp32)."""
        q = probabilities(self.logits(g), params)
        return sample(q, generator), q

    # ---- per-slot state -----------------------------------------------------------
    def reset(self, n_slots: int) -> None:
        w = self.token_norm.weight  # the drafter's dtype and device
        self.cache = KVCache.for_model(self.layer_config, n_slots, w.dtype, w.device)
        self.committed = torch.zeros(n_slots, dtype=torch.long, device=w.device)

    def release(self, slot: int) -> None:
        self.cache.lengths[slot] = 0
        self.committed[slot] = 0

    def _run(self, x: torch.Tensor, slots: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        # host sync: the pass's shapes (and the room check)
        rb = RaggedIndex.build(slots, lens, self.cache.lengths[slots], self.cache.max_seq_len)
        g, _ = run_blocks_cached(self.layers, x, rb, self.cache, self.rope_cos, self.rope_sin)
        self.cache.advance(slots, lens)
        return g

    @torch.no_grad()
    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        if self.cache is None:
            raise RuntimeError("call reset(n_slots) before propose")
        R = slots.shape[0]
        self.cache.lengths[slots] = self.committed[slots]  # drop entries built from own drafts
        # entry i = feature i + token i+1 (the anchor after the last)
        ends = torch.cumsum(committed_lens, 0)
        next_tokens = committed_tokens.roll(-1)  # segments are contiguous: i+1 is the same request
        next_tokens[ends - 1] = anchors
        g = self._run(self.entries(next_tokens, self.features_of(features)), slots, committed_lens)
        self.committed[slots] = self.cache.lengths[slots]
        g_last = g[ends - 1]  # (R, dim): predicts the token after the anchor
        tokens, probs = [], []
        for k in range(gamma):
            x, q = self.next_token(g_last, params, generator)
            tokens.append(x)
            probs.append(q)
            if k + 1 < gamma:  # feed back: own output as the feature of the drafted position
                g_last = self._run(self.entries(x, g_last), slots, torch.ones_like(slots))
        if not tokens:
            V = self.target.config.vocab_size
            return Proposal(slots.new_zeros(R, 0), torch.zeros(R, 0, V, device=slots.device))
        return Proposal(torch.stack(tokens, 1), torch.stack(probs, 1))
