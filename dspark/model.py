"""The target language model: a small Llama-style decoder.

RMSNorm, rotary position embeddings (RoPE), SwiGLU feed-forward and
grouped-query attention, with the LM head tied to the token embedding.

One model, two entry points:
  * `forward(tokens)` -- a plain (B, T) causal pass without a cache, used for
    training and as the ground truth the cached path is tested against;
  * `forward_cached(tokens, slots, block_lens, cache)` -- appends a ragged
    block to each listed KV-cache slot: the whole prompt at prefill, one token
    per step when decoding, anchor + γ drafts when verifying. Tokens of all
    requests arrive flattened into one (N,) vector; inside a block attention
    is causal, and every token sees its own slot's cache in full.

Both can also return the residual stream after the configured "tap" layers;
drafters read these as context features (walkthrough/DESIGN.md section 2).

What this file does not do: sampling, generation loops, drafting. The ragged
attention reference (`ragged_attention_reference`) pads each block to the
longest one *inside the attention op only*; projections and feed-forwards run
on the flat token vector. `ragged_attention` dispatches to the Triton kernel
in `kernels/ragged_attention.py` instead when `dspark.backend` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark import backend
from dspark.config import ModelConfig
from dspark.device import to_host, upload
from dspark.kv_cache import KVCache

BY_REQUEST_MIN_BLOCK = 16  # blocks this long are prefills, where attending request by request can pay


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V) or (N, V) (or (S, V) with last_only, (M, V) with logits_at)
    last_hidden: torch.Tensor  # final-normed hidden that feeds the LM head, same leading dims
    taps: torch.Tensor | None = None  # (..., n_taps, dim) residual stream after each tap layer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_table(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (max_seq_len, head_dim // 2)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x1, x2) halves of the last dim; cos/sin broadcast over the head dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class Attention(nn.Module):
    """Grouped-query attention. `qk_norm`: a per-head RMSNorm on q and k before RoPE (Qwen3's `q_norm` /
    `k_norm`; the drafter layers' option, the target has none); `in_dim`: the width q/k/v read (default
    `dim`; 2·dim in the EAGLE-3 layer)."""

    def __init__(self, config: ModelConfig, qk_norm: bool = False, in_dim: int | None = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            config.n_heads,
            config.n_kv_heads,
            config.head_dim,
        )
        kv_dim, in_dim = config.n_kv_heads * config.head_dim, in_dim or config.dim
        self.wq = nn.Linear(in_dim, config.dim, bias=False)
        self.wk = nn.Linear(in_dim, kv_dim, bias=False)
        self.wv = nn.Linear(in_dim, kv_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if qk_norm else None  # over each head's hd
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if qk_norm else None

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (..., in_dim) -> q (..., H, hd) and k (..., Hkv, hd), normed per head if so built and rotated,
        and v (..., Hkv, hd)."""
        q = self.wq(x).view(*x.shape[:-1], self.n_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        v = self.wv(x).view(*x.shape[:-1], self.n_kv_heads, self.head_dim)
        return apply_rope(q, cos, sin), self.rotated_keys(x, cos, sin), v

    def rotated_keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The keys of x (..., in_dim): (..., Hkv, hd), normed per head if so built, then rotated -- what
        `_qkv` returns as k, and what a parallel drafter's context features become (`context_kv`)."""
        k = self.wk(x).view(*x.shape[:-1], self.n_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Full causal attention over x: (B, T, dim); cos/sin: (T, 1, head_dim/2)."""
        B, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))  # (B, H, T, hd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def forward_cached(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int, cache: KVCache, rb
    ) -> torch.Tensor:
        """Ragged attention for flat tokens x: (N, dim) against the cache.

        `rb` is the `RaggedIndex` index bundle built once per forward."""
        q, k, v = self._qkv(x, cos, sin)  # (N, H, hd), (N, Hkv, hd), (N, Hkv, hd)
        cache.keys[layer][rb.token_slot, :, rb.positions] = k.to(cache.keys.dtype)
        cache.values[layer][rb.token_slot, :, rb.positions] = v.to(cache.values.dtype)
        out = ragged_attention(q, cache.keys[layer], cache.values[layer], rb)  # (N, H, hd)
        return self.wo(out.reshape(x.shape[0], -1))


def ragged_attention_reference(
    q: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor, rb: RaggedIndex
) -> torch.Tensor:
    """Variable-length verify attention (paper §5.3), the PyTorch reference.

    q: (N, H, hd) flat queries of all blocks; layer_keys/values: one layer of
    the cache, (n_slots_total, Hkv, T_max, hd), the blocks' own keys already
    written. Token i of a block sees its slot's cache before the block and the
    block up to itself. Pads every block to the longest, runs SDPA with
    `rb.mask` (bf16/fp16 on a CPU: `grouped_attention`) and unpads. Returns
    (N, H, hd) in q's dtype."""
    if rb.pads_wastefully:
        return attention_by_request(q, layer_keys, layer_values, rb)
    keys = rb.take_slots(layer_keys)  # (S, Hkv, L, hd)
    values = rb.take_slots(layer_values)
    q_pad = q.new_zeros(rb.n_slots, rb.block_max, q.shape[1], q.shape[2])  # (S, Tb, H, hd), rows as keys
    q_pad[rb.token_row, rb.offsets] = q
    if q.dtype in (torch.bfloat16, torch.float16) and q.device.type == "cpu":
        out = grouped_attention(q_pad, keys.to(q.dtype), values.to(q.dtype), rb.mask)  # (S, Tb, H, hd)
        return out[rb.token_row, rb.offsets]
    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2),  # (S, H, Tb, hd)
        keys.to(q.dtype),
        values.to(q.dtype),
        attn_mask=rb.mask,  # (S, 1, Tb, L)
        enable_gqa=True,
    )
    return out.transpose(1, 2)[rb.token_row, rb.offsets]  # (N, H, hd)


def attention_by_request(
    q: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor, rb: RaggedIndex
) -> torch.Tensor:
    """`ragged_attention_reference` for a pass that mixes long blocks with others (`rb.pads_wastefully`: a
    prefill of prompts of unequal lengths, or prompts beside verify blocks), where padding every block to
    the longest would cost several times the query-key pairs the requests need: the reference runs once per
    part of `rb.split()` -- each long block on its own, the short blocks padded together. Returns (N, H, hd)
    in q's dtype."""
    out = torch.empty_like(q)
    for part, tokens in rb.split():  # a RaggedIndex of the part, its flat token indices (N_p,)
        out[tokens] = ragged_attention_reference(q[tokens], layer_keys, layer_values, part)
    return out


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Masked grouped-query attention written out: q (S, Tb, H, hd), keys/values (S, Hkv, L, hd), mask
    (S, 1, Tb, L) True = visible -> (S, Tb, H, hd). Scores and softmax in fp32.

    What SDPA computes, for bf16 on a CPU: there torch's SDPA kernel parallelises a one-token query badly
    (batch 16 decode: 2.5 ms a layer against 0.25 ms written out, measured on this 2-core machine)."""
    S, Tb, H, hd = q.shape
    Hkv, L = keys.shape[1], keys.shape[2]
    g = H // Hkv  # query heads per key/value head
    q = q.view(S, Tb, Hkv, g, hd).permute(0, 2, 3, 1, 4).reshape(S, Hkv, g * Tb, hd)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float().mul_(hd**-0.5).view(S, Hkv, g, Tb, L)
    scores = scores.masked_fill_(~mask[:, :, None], float("-inf"))  # mask (S, 1, 1, Tb, L)
    weights = torch.softmax(scores, dim=-1).to(values.dtype).view(S, Hkv, g * Tb, L)
    out = torch.matmul(weights, values).view(S, Hkv, g, Tb, hd)
    return out.permute(0, 3, 1, 2, 4).reshape(S, Tb, H, hd)


def ragged_attention(
    q: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor, rb: RaggedIndex
) -> torch.Tensor:
    """`ragged_attention_reference`, or the Triton kernel when `dspark.backend` picks it."""
    if backend.use_kernel(q, layer_keys, layer_values):
        from kernels.ragged_attention import ragged_verify_attention

        return ragged_verify_attention(
            q, layer_keys, layer_values, rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index,
            max_block_len=rb.block_max,  # already on the host: no sync per layer
        )  # fmt: skip
    return ragged_attention_reference(q, layer_keys, layer_values, rb)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w_up = nn.Linear(config.dim, config.ffn_hidden, bias=False)
        self.w_down = nn.Linear(config.ffn_hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """A pre-norm decoder layer (`qk_norm`: its attention norms q and k per head, `Attention`)."""

    def __init__(self, config: ModelConfig, qk_norm: bool = False) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config, qk_norm)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn = FeedForward(config)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the layer input x (..., dim): RMSNorm(x)."""
        return self.attn_norm(x)

    def residual(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention output is added to: x itself (the EAGLE-3 layer differs)."""
        return x


class RaggedIndex:
    """Index bookkeeping for one ragged forward, shared by all layers.

    Built before the cache lengths advance: `positions` are where the new
    tokens go. It reads the host once (the shapes of the pass and the numbers
    the checks need) and refuses a block that would overflow the cache.

    slots (S,) cache slots; block_lens (S,); tokens are flat, slot-major.
    Request r (0..S-1) owns flat tokens cu_seqlens[r]..cu_seqlens[r+1]-1;
    `slot_index` (N,) is the request id of every token. `slots`, `starts`,
    `cu_seqlens` and `slot_index` are what the attention kernel reads.

    The PyTorch attention reads the slots' keys as (S, Hkv, L, hd), one row per
    slot. When the slots, in whatever order, fill a range lo..lo+S-1 -- every
    step of a full batch, as requests finish and are replaced in any order --
    that is a view of the cache (`take_slots`) and `row` (S,) maps request r to
    its row slots[r] - lo; otherwise the rows are gathered in request order (a
    copy of the whole key range, every layer)."""

    def __init__(
        self,
        slots: torch.Tensor,
        block_lens: torch.Tensor,
        cache: KVCache,
        starts: torch.Tensor | None = None,
    ) -> None:
        device = slots.device
        self.n_slots = S = slots.shape[0]
        self.slots, self.block_lens, self.cache = slots, block_lens, cache  # (S,), (S,)
        # (S,) positions already in the cache (`starts`: given, for a part of a pass whose cache has advanced)
        self.starts = starts = cache.lengths[slots] if starts is None else starts
        lo = slots.min()
        distinct = (slots[:, None] == slots[None, :]).sum() == S
        fills_range = distinct & (slots.max() - lo + 1 == S)  # a permutation of lo..lo+S-1
        useful = (block_lens * (starts + block_lens)).sum()  # query-key pairs the requests' attention needs
        facts = torch.stack([block_lens.max(), (starts + block_lens).max(), block_lens.sum(), block_lens.min(),
                             lo, fills_range.long(), useful])  # fmt: skip
        # host sync: the pass's shapes (longest block, longest key range) and what the checks need
        self.block_max, self.kv_len, self.n_tokens, shortest, first_slot, fills_range, useful = to_host(
            facts, "ragged index: shapes and checks"
        )
        if shortest < 0:
            raise ValueError("block lengths must be >= 0")
        if self.kv_len > cache.max_seq_len:  # before anything is written
            raise ValueError(f"sequence of {self.kv_len} tokens exceeds the context of {cache.max_seq_len}")
        self.shortest_block = shortest
        request = torch.arange(S, device=device)
        self.slot_index = torch.repeat_interleave(request, block_lens, output_size=self.n_tokens)  # (N,)
        ends = torch.cumsum(block_lens, 0)
        self.cu_seqlens = torch.cat([ends.new_zeros(1), ends])  # (S+1,) flat offset of each block
        first = self.cu_seqlens[:-1]  # (S,) flat index of each block start
        self.offsets = torch.arange(self.n_tokens, device=device) - first[self.slot_index]
        self.positions = starts[self.slot_index] + self.offsets  # (N,) absolute positions
        self.token_slot = slots[self.slot_index]  # (N,) cache slot of every token
        self.row = slots - first_slot if fills_range else request  # (S,) each request's row of take_slots
        self.token_row = self.row[self.slot_index]  # (N,) the row of every token
        row_starts = torch.empty_like(starts)
        row_starts[self.row] = starts  # (S,) cache length before the block, per row
        key_pos = torch.arange(self.kv_len, device=device)  # L: keys to read per slot
        query_pos = row_starts[:, None] + torch.arange(self.block_max, device=device)  # (S, Tb)
        self.mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]  # (S, 1, Tb, L), per row
        self._slot_range = (first_slot, first_slot + S) if fills_range else None
        # long blocks beside shorter ones (a prefill of unequal prompts; prompts beside verify blocks):
        # padding each to the longest would waste most of the attention work, so the PyTorch reference
        # attends to each long block on its own and pads only the short ones together
        self.pads_wastefully = (
            self.block_max >= BY_REQUEST_MIN_BLOCK and S > 1 and S * self.block_max * self.kv_len > 2 * useful
        )
        self._split: list[tuple[RaggedIndex, torch.Tensor]] | None = None

    def split(self) -> list[tuple[RaggedIndex, torch.Tensor]]:
        """For a pass that `pads_wastefully`: its parts, each (a RaggedIndex of some of its blocks, their flat
        token indices (N_p,)) -- every long block alone, then the short ones together; no part pads wastefully
        itself. Read on first use: only the PyTorch reference attention asks (the kernel and the drafters'
        context writes never do); each part takes the pass's own starts."""
        if self._split is None:
            per = to_host(torch.stack([self.cu_seqlens[:-1], self.block_lens], 1), "ragged index: its parts")
            groups = [[r] for r, (_, n) in enumerate(per) if n >= BY_REQUEST_MIN_BLOCK]  # each long block
            short = [r for r, (_, n) in enumerate(per) if n < BY_REQUEST_MIN_BLOCK]
            groups += [short] if short else []
            device, self._split = self.slots.device, []
            for rows in groups:
                tokens = upload([t for r in rows for t in range(per[r][0], per[r][0] + per[r][1])], device)
                at = upload(rows, device)
                part = RaggedIndex(self.slots[at], self.block_lens[at], self.cache, self.starts[at])
                self._split.append((part, tokens))
        return self._split

    def take_slots(self, layer_cache: torch.Tensor) -> torch.Tensor:
        """(n_slots_total, Hkv, T, hd) -> (S, Hkv, L, hd), row `row[r]` holding request r's slot: a view
        when the slots fill a range, else a gather in request order."""
        if self._slot_range is not None:
            return layer_cache[self._slot_range[0] : self._slot_range[1], :, : self.kv_len]
        return layer_cache[self.slots, :, : self.kv_len]


def run_blocks_cached(
    blocks: nn.ModuleList,
    x: torch.Tensor,
    rb: RaggedIndex,
    cache: KVCache,
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    tap_layers: tuple[int, ...] = (),
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Run pre-norm blocks over flat inputs x: (N, dim), block i using cache layer i.

    Shared by the target and by drafters that keep their own small KV cache (a block's
    `attention_input` and `residual` say how it reads x: the EAGLE-3 layer's x is wider).
    Does not advance the cache lengths (the caller does, once). Returns the
    output (N, dim) and the residual stream after each layer in `tap_layers`."""
    cos, sin = rope_cos[rb.positions, None], rope_sin[rb.positions, None]  # (N, 1, hd/2)
    taps = [] if tap_layers else None
    for i, block in enumerate(blocks):
        x = block.residual(x) + block.attn.forward_cached(block.attention_input(x), cos, sin, i, cache, rb)
        x = x + block.ffn(block.ffn_norm(x))
        if i in tap_layers:
            taps.append(x)
    return x, taps


def cast_keeping_rope(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`module.to(dtype)` except its `rope_cos`/`rope_sin` tables, which stay fp32 (bf16 angles would be ~0.4%
    off). For the target and for drafters, which hold their own tables. Returns the module."""
    cos, sin = module.rope_cos, module.rope_sin
    module.to(dtype)
    module.rope_cos, module.rope_sin = cos, sin
    return module


class Transformer(nn.Module):
    # logits x Wᵀ of an LM head (this one, and a drafter's rows of it), and how this model's projections
    # compute: plain here; dspark/lab/cpu_speed.py swaps both on a CPU where another order pays
    project_to_vocab = staticmethod(F.linear)
    speed_paths = "F.linear"

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
        """Weights (and so the KV cache `new_cache` makes) in `dtype`; the RoPE tables stay fp32. Returns self."""
        return cast_keeping_rope(self, dtype)

    def new_cache(
        self, n_slots: int, dtype: torch.dtype | None = None, max_seq_len: int | None = None
    ) -> KVCache:
        """A KV cache for `n_slots` requests of up to `max_seq_len` tokens (default: the whole context; a
        smaller one for short requests of a long-context model saves allocating and zeroing gigabytes)."""
        dtype = dtype or self.embed.weight.dtype
        c = self.config
        length = min(max_seq_len or c.max_seq_len, c.max_seq_len)
        return KVCache(c.n_layers, n_slots, c.n_kv_heads, length, c.head_dim, dtype, self.embed.weight.device)

    def _head(
        self, x: torch.Tensor, taps: list[torch.Tensor] | None, logits_at: torch.Tensor | None = None
    ) -> ModelOutput:
        hidden = self.norm(x)
        stacked = torch.stack(taps, dim=-2) if taps is not None else None
        scored = hidden if logits_at is None else hidden[logits_at]
        return ModelOutput(self.project_to_vocab(scored, self.lm_head.weight), hidden, stacked)

    def forward(self, tokens: torch.Tensor, return_taps: bool = False) -> ModelOutput:
        """tokens: (B, T) -> logits (B, T, V). No cache: training and reference."""
        T = tokens.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds context {self.config.max_seq_len}")
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
        tokens: torch.Tensor,
        slots: torch.Tensor,
        block_lens: torch.Tensor,
        cache: KVCache,
        return_taps: bool = False,
        last_only: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Append a ragged block per slot and return logits for the new tokens.

        tokens: (N,) flat, slot-major: the first block_lens[0] belong to
        slots[0], and so on. slots, block_lens: (S,) int64, block_lens >= 1,
        slots distinct. Returns logits (N, V), or (S, V) for each block's last
        token with last_only=True (prefill, without taps or hidden states elsewhere), or
        logits only at the flat positions `logits_at` (M,) -> (M, V) while the taps and hidden
        states cover all N (a prefill whose drafter reads every prompt position: the LM head is
        the largest layer of a real target). The cache lengths advance by
        block_lens; roll back with `cache.rollback`.
        """
        if tokens.dim() != 1 or slots.dim() != 1 or slots.shape != block_lens.shape:
            raise ValueError("tokens must be (N,), slots and block_lens both (S,)")
        if slots.shape[0] == 0:
            raise ValueError("block_lens must be >= 1 and sum to the number of tokens")
        if last_only and logits_at is not None:
            raise ValueError("last_only and logits_at exclude each other")
        rb = RaggedIndex(slots, block_lens, cache)  # checks the context (one host read)
        if rb.n_tokens != tokens.shape[0] or rb.shortest_block < 1:
            raise ValueError("block_lens must be >= 1 and sum to the number of tokens")
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
