"""The target: a small Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention, tied LM head).

`forward(tokens)` is a plain (B, T) causal pass (training, and the reference). `forward_cached` appends a
ragged block to each KV-cache slot (a prompt, one token, or anchor + γ drafts), all requests' tokens flat in
one (N,) vector. Both can return the "tap" layers drafters read (walkthrough/DESIGN.md §2). Look at
`RaggedIndex` and `ragged_attention_reference`: pad blocks inside attention only, SDPA under a mask.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.kv_cache import KVCache
from dspark_kernels import use_kernel


@dataclass
class ModelConfig:
    """The target model's shape, one comment per field; stored as JSON beside every checkpoint."""

    vocab_size: int = 4096  # size of the BPE vocabulary (tokenizer.json)
    dim: int = 256  # width of the residual stream
    n_layers: int = 6  # number of transformer blocks
    n_heads: int = 8  # query heads per attention layer
    n_kv_heads: int = 2  # key/value heads (grouped-query attention: n_heads % n_kv_heads == 0)
    ffn_hidden: int = 688  # hidden width of the SwiGLU feed-forward
    max_seq_len: int = 512  # context length: RoPE table and KV-cache size
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = True  # LM head shares the token-embedding matrix
    # blocks whose output (the residual stream) drafters read as features (DESIGN.md §2)
    tap_layers: tuple[int, ...] = (0, 2, 3)

    def __post_init__(self) -> None:
        """`load_target`'s one check (the JSON twin): positive sizes, heads that divide, taps that exist."""
        self.tap_layers = tuple(self.tap_layers)
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len")
        for name in (*sizes, "rope_theta", "norm_eps"):
            value, kind = getattr(self, name), int if name in sizes else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value < math.inf:
                what = "integer" if name in sizes else "finite number"
                raise ValueError(f"{name} must be a positive {what}, got {value!r}")
        if self.dim % (2 * self.n_heads) or self.n_heads % self.n_kv_heads:
            raise ValueError(
                "dim must be divisible by 2·n_heads (an even head dimension for RoPE), n_heads by n_kv_heads"
            )
        if any(not 0 <= t < self.n_layers for t in self.tap_layers):
            raise ValueError(f"tap_layers {self.tap_layers} outside 0..{self.n_layers - 1}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def drafter_layers(self, n_layers: int, ffn_hidden: int, extra_positions: int) -> ModelConfig:
        """Config of a drafter's own layers: this model's width, heads and RoPE, the
        drafter's depth and FFN width, room for `extra_positions` draft positions."""
        longer = self.max_seq_len + extra_positions
        return replace(self, n_layers=n_layers, ffn_hidden=ffn_hidden, max_seq_len=longer, tap_layers=())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown config fields: {sorted(unknown)}")
        return cls(**d)


@dataclass
class ModelOutput:
    logits: Tensor  # (B, T, V) or (N, V) (or (S, V) with last_only, (M, V) with logits_at)
    last_hidden: Tensor  # final-normed hidden that feeds the LM head, same leading dims
    taps: Tensor | None = None  # (..., n_taps, dim) residual stream after each tap layer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_table(config: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos and sin of shape (max_seq_len, head_dim // 2)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (x1, x2) halves of the last dim; cos/sin broadcast over the head dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


@dataclass(eq=False)
class RaggedIndex:
    """Index bookkeeping for one ragged forward, shared by all layers (nano-vllm's `Context`). Tokens are
    flat, slot-major: request r owns flat tokens cu_seqlens[r]..cu_seqlens[r+1]-1."""

    slots: Tensor  # (S,) cache slots
    block_lens: Tensor  # (S,) tokens appended to each
    starts: Tensor  # (S,) positions already in the cache
    cu_seqlens: Tensor  # (S+1,) flat offset of each block
    slot_index: Tensor  # (N,) request of every token
    offsets: Tensor  # (N,) place of every token in its block
    positions: Tensor  # (N,) absolute positions: where the new keys go
    token_slot: Tensor  # (N,) cache slot of every token
    mask: Tensor  # (S, 1, Tb, L) key visible to query, True = visible
    block_max: int  # Tb: the longest block
    kv_len: int  # L: the longest key range
    n_tokens: int  # N
    shortest_block: int

    @classmethod
    def build(cls, slots: Tensor, block_lens: Tensor, starts: Tensor, context: int) -> RaggedIndex:
        """The index of a pass appending block_lens (S,) tokens to `slots` (S,) after `starts` (S,) cached
        positions. One host read (shapes and checks); asserts the cache does not overflow."""
        ends = starts + block_lens  # (S,) each slot's length after the pass
        facts = torch.stack([block_lens.max(), ends.max(), block_lens.sum(), block_lens.min()])
        block_max, kv_len, n_tokens, shortest = facts.tolist()  # host sync: shapes and checks
        assert kv_len <= context, f"sequence of {kv_len} tokens exceeds the context of {context}"
        device = slots.device
        request = torch.arange(slots.shape[0], device=device)
        slot_index = torch.repeat_interleave(request, block_lens, output_size=n_tokens)  # (N,)
        cu_seqlens = torch.cat([block_lens.new_zeros(1), torch.cumsum(block_lens, 0)])
        offsets = torch.arange(n_tokens, device=device) - cu_seqlens[slot_index]
        query_pos = starts[:, None] + torch.arange(block_max, device=device)  # (S, Tb)
        mask = torch.arange(kv_len, device=device) <= query_pos[:, :, None]  # (S, Tb, L)
        per_token = (
            offsets,
            starts[slot_index] + offsets,
            slots[slot_index],
        )  # offsets, positions, token_slot
        per_slot = (slots, block_lens, starts, cu_seqlens, slot_index)
        return cls(*per_slot, *per_token, mask[:, None], block_max, kv_len, n_tokens, shortest)


def masked_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention of padded blocks by SDPA: q (S, Tb, H, hd), keys/values (S, Hkv, L, hd), mask
    (S, 1, Tb, L) True = visible -> (S, Tb, H, hd)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


def ragged_attention_reference(
    q: Tensor, layer_keys: Tensor, layer_values: Tensor, rb: RaggedIndex
) -> Tensor:
    """Variable-length verify attention (paper §5.3), the PyTorch reference: q (N, H, hd) against one cache
    layer (n_slots, Hkv, T_max, hd), the blocks' keys already written -> (N, H, hd). Token i of a block sees
    its slot's cache and its block up to itself."""
    keys = layer_keys[rb.slots, :, : rb.kv_len].to(q.dtype)  # (S, Hkv, L, hd)
    values = layer_values[rb.slots, :, : rb.kv_len].to(q.dtype)
    q_pad = q.new_zeros(len(rb.slots), rb.block_max, *q.shape[1:])  # (S, Tb, H, hd)
    q_pad[rb.slot_index, rb.offsets] = q
    return masked_attention(q_pad, keys, values, rb.mask)[rb.slot_index, rb.offsets]  # (N, H, hd)


def ragged_attention(q: Tensor, layer_keys: Tensor, layer_values: Tensor, rb: RaggedIndex) -> Tensor:
    """`ragged_attention_reference`, or the Triton kernel when `dspark_kernels.use_kernel` picks it."""
    if use_kernel(q, layer_keys, layer_values):
        from dspark_kernels.ragged_attention import ragged_verify_attention

        index = (rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index)
        # the longest block is already on the host: no sync per layer
        return ragged_verify_attention(q, layer_keys, layer_values, *index, max_block_len=rb.block_max)
    return ragged_attention_reference(q, layer_keys, layer_values, rb)


class Attention(nn.Module):
    """Grouped-query attention. `qk_norm`: per-head RMSNorm on q and k before RoPE (Qwen3; drafter layers
    only); `in_dim`: the width q/k/v read (2·dim in the EAGLE-3 layer)."""

    def __init__(self, config: ModelConfig, qk_norm: bool = False, in_dim: int | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        kv_dim, in_dim = config.n_kv_heads * config.head_dim, in_dim or config.dim
        self.wq = nn.Linear(in_dim, config.dim, bias=False)
        self.wk = nn.Linear(in_dim, kv_dim, bias=False)
        self.wv = nn.Linear(in_dim, kv_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if qk_norm else None  # over each head's hd
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if qk_norm else None

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor):
        """x (..., in_dim) -> q (..., H, hd) and k (..., Hkv, hd), normed per head if so built and rotated,
        and v (..., Hkv, hd)."""
        q = self.wq(x).view(*x.shape[:-1], self.n_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        v = self.wv(x).view(*x.shape[:-1], self.n_kv_heads, self.head_dim)
        return apply_rope(q, cos, sin), self.rotated_keys(x, cos, sin), v

    def rotated_keys(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The keys of x (..., in_dim): (..., Hkv, hd), normed per head if so built, then rotated."""
        k = self.wk(x).view(*x.shape[:-1], self.n_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Full causal attention over x: (B, T, dim); cos/sin: (T, 1, head_dim/2)."""
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))  # (B, H, T, hd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def forward_cached(self, x: Tensor, cos: Tensor, sin: Tensor, layer: int, cache: KVCache, rb) -> Tensor:
        """Ragged attention for flat tokens x: (N, dim) against the cache; `rb`: the pass's `RaggedIndex`."""
        q, k, v = self._qkv(x, cos, sin)  # (N, H, hd), (N, Hkv, hd), (N, Hkv, hd)
        cache.keys[layer][rb.token_slot, :, rb.positions] = k.to(cache.keys.dtype)
        cache.values[layer][rb.token_slot, :, rb.positions] = v.to(cache.values.dtype)
        out = ragged_attention(q, cache.keys[layer], cache.values[layer], rb)  # (N, H, hd)
        return self.wo(out.reshape(x.shape[0], -1))

    def forward_masked(
        self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor
    ) -> Tensor:
        """A drafter's blocks x (R, S, in_dim) attending to context keys/values (R, Hkv, L, hd) and to their
        own under `mask` (R, 1, S, L + S), True = visible -> (R, S, dim); cos/sin (R, S, 1, hd/2)."""
        q, k, v = self._qkv(x, cos, sin)  # (R, S, H|Hkv, hd)
        keys = torch.cat([ctx_k, k.transpose(1, 2)], dim=2)  # (R, Hkv, L + S, hd)
        values = torch.cat([ctx_v, v.transpose(1, 2)], dim=2)
        return self.wo(masked_attention(q, keys, values, mask).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w_up = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w_down = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """A pre-norm decoder layer (`qk_norm`: its attention norms q and k per head, `Attention`)."""

    def __init__(self, config: ModelConfig, qk_norm: bool = False) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config, qk_norm)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn = FeedForward(config)

    def attention_input(self, x: Tensor) -> Tensor:
        """What the attention reads of the layer input x (..., dim): RMSNorm(x)."""
        return self.attn_norm(x)

    def residual(self, x: Tensor) -> Tensor:
        """What the attention output is added to: x itself (the EAGLE-3 layer differs)."""
        return x


def run_blocks_cached(
    blocks: nn.ModuleList,
    x: Tensor,
    rb: RaggedIndex,
    cache: KVCache,
    rope_cos: Tensor,
    rope_sin: Tensor,
    tap_layers: tuple[int, ...] = (),
) -> tuple[Tensor, list[Tensor] | None]:
    """Run pre-norm blocks over flat x (N, dim), block i on cache layer i (the target's, or a drafter's own).
    Does not advance the cache lengths. Returns (N, dim) and the residual stream after each tap layer."""
    cos, sin = rope_cos[rb.positions, None], rope_sin[rb.positions, None]  # (N, 1, hd/2)
    taps = [] if tap_layers else None
    for i, block in enumerate(blocks):
        x = block.residual(x) + block.attn.forward_cached(block.attention_input(x), cos, sin, i, cache, rb)
        x = x + block.ffn(block.ffn_norm(x))
        if i in tap_layers:
            taps.append(x)
    return x, taps


def cast_keeping_rope(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`module.to(dtype)` except its RoPE tables, which stay fp32 (bf16 angles are visibly off)."""
    cos, sin = module.rope_cos, module.rope_sin
    module.to(dtype)
    module.rope_cos, module.rope_sin = cos, sin
    return module


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_table(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scale residual projections (GPT-2)
            if name.endswith(("wo.weight", "w_down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def cast(self, dtype: torch.dtype) -> Transformer:
        """Weights (and so the KV cache `new_cache` makes) in `dtype`; RoPE tables stay fp32. Returns self."""
        return cast_keeping_rope(self, dtype)

    def new_cache(
        self, n_slots: int, dtype: torch.dtype | None = None, max_seq_len: int | None = None
    ) -> KVCache:
        """A KV cache for `n_slots` requests of up to `max_seq_len` tokens (default: the whole context)."""
        dtype = dtype or self.embed.weight.dtype
        c = self.config
        length = min(max_seq_len or c.max_seq_len, c.max_seq_len)
        return KVCache(c.n_layers, n_slots, c.n_kv_heads, length, c.head_dim, dtype, self.embed.weight.device)

    def _head(self, x: Tensor, taps: list[Tensor] | None, logits_at: Tensor | None = None) -> ModelOutput:
        hidden = self.norm(x)
        stacked = torch.stack(taps, dim=-2) if taps is not None else None
        scored = hidden if logits_at is None else hidden[logits_at]
        return ModelOutput(self.lm_head(scored), hidden, stacked)

    def forward(self, tokens: Tensor, return_taps: bool = False) -> ModelOutput:
        """tokens: (B, T) -> logits (B, T, V). No cache: training and reference."""
        T = tokens.shape[1]
        assert T <= self.config.max_seq_len, f"{T} tokens exceed the {self.config.max_seq_len}-token context"
        cos, sin = self.rope_cos[:T, None], self.rope_sin[:T, None]  # (T, 1, hd/2)
        x = self.embed(tokens)
        taps = [] if return_taps else None
        for i, block in enumerate(self.blocks):
            x = x + block.attn(block.attn_norm(x), cos, sin)
            x = x + block.ffn(block.ffn_norm(x))
            if return_taps and i in self.config.tap_layers:
                taps.append(x)
        return self._head(x, taps)

    def forward_cached(
        self,
        tokens: Tensor,
        slots: Tensor,
        block_lens: Tensor,
        cache: KVCache,
        return_taps: bool = False,
        last_only: bool = False,
        logits_at: Tensor | None = None,
    ) -> ModelOutput:
        """Append a ragged block per slot and return logits for the new tokens.

        tokens (N,) flat, slot-major; slots, block_lens (S,) int64, block_lens >= 1, slots distinct. Logits
        (N, V); with last_only, (S, V) for each block's last token; with `logits_at` (M,), (M, V) at those
        flat positions (taps and hidden still cover all N). The cache lengths advance by block_lens."""
        assert not (last_only and logits_at is not None), "last_only and logits_at exclude each other"
        rb = RaggedIndex.build(slots, block_lens, cache.lengths[slots], cache.max_seq_len)  # one host read
        assert rb.shortest_block >= 1 and rb.n_tokens == len(tokens), "block_lens must be >= 1, sum N"
        taps_at = self.config.tap_layers if return_taps else ()
        x, taps = run_blocks_cached(
            self.blocks, self.embed(tokens), rb, cache, self.rope_cos, self.rope_sin, taps_at
        )
        cache.advance(slots, block_lens)
        if last_only:
            last = torch.cumsum(block_lens, 0) - 1
            x = x[last]
            taps = [t[last] for t in taps] if taps is not None else None
        return self._head(x, taps, logits_at)
