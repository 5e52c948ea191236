"""DSpark's drafter: a parallel (DFlash-style) backbone + a sequential head + a confidence head.

Backbone (DESIGN.md section 2): the block `[x0, MASK × (γ−1)]` after anchor x0 gives γ logits U_1..U_γ
in one pass, attending bidirectionally inside the block and to the context strictly before x0,

    H_ctx = RMSNorm(W_c [H(l1); ...; H(lm)])       (tap layers; K/V through each layer's W_K, W_V)

whose keys/values the drafter caches per committed position. Sequential head, left to right:

    p_k(v) = softmax_v( U_k(v) + B_k(x_{k-1}, v) ),   x_0 = anchor
      Markov: B = W1[x_{k-1}] W2                      (W1: V × r, W2: r × V)
      RNN:    s_k = σ(g) s_{k-1} + (1 − σ(g)) tanh(c),  B = tanh(o) W2   (g, c, o from [s; W1[x]; h_k])
      r = 0:  B = 0, the DFlash baseline
    c_k = σ(wᵀ [h_k ; W1[x_{k-1}]]) ≈ P(draft k survives | drafts < k survived)   (None for DFlash)

One round reads the host once: the ragged index of the context it appends.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dspark.device import generator_uniforms
from dspark.drafters.base import Drafter, Proposal, TargetFeatures
from dspark.kv_cache import KVCache
from dspark.model import Block, RaggedIndex, RMSNorm, Transformer, rope_table
from dspark.sampling import SamplingParams, draw_token, probabilities
from dspark.tokenizer import MASK, SPECIAL_TOKENS
from dspark_kernels import use_kernel

KINDS = {"dflash": "none", "dspark": "markov", "dspark-rnn": "rnn"}  # kind -> sequential head


def markov_step(
    u_k: torch.Tensor,
    h_k: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Markov-head step: logits U_k + W2 W1[x_{k-1}] (R, V) and c_k = σ(wᵀ[h_k; W1[x_{k-1}]]) (R,).

    u_k (R, V) backbone logits, h_k (R, dim) backbone hidden, prev (R,) x_{k-1};
    w1 (V, r), w2 (V, r) (nn.Linear layout), conf_weight (dim + r,), conf_bias (1,)."""
    e = F.embedding(prev, w1)  # (R, r)
    conf = torch.sigmoid(F.linear(torch.cat([h_k, e], dim=-1), conf_weight[None], conf_bias)).squeeze(-1)
    return u_k + F.linear(e, w2), conf


def head_loop(step, u: torch.Tensor, h: torch.Tensor, first: torch.Tensor, choose) -> tuple[list, list]:
    """The sequential head over a block, left to right: the one loop of drafting, of the kernel's reference and
    of teacher-forced training. `step(U_k, h_k, x_{k-1}, state)` -> (logits (R, V), c_k (R,) or None, state);
    `choose(k, logits)` -> x_k (a draw when drafting, the label when training); x_0 = `first` (R,).
    Returns the γ logits and the γ confidences."""
    prev, state, logits, confs = first, None, [], []
    for k in range(u.shape[1]):
        logits_k, conf, state = step(u[:, k], h[:, k], prev, state)
        logits.append(logits_k)
        confs.append(conf)
        prev = choose(k, logits_k)
    return logits, confs


def sample_block(
    step,
    u: torch.Tensor,
    h: torch.Tensor,
    first: torch.Tensor,
    params: SamplingParams,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafting: `head_loop` drawing x_k from q_k with uniforms[:, k] -> tokens (R, γ), q (R, γ, V) fp32, c (R, γ)."""
    tokens, probs = [], []

    def draw(k: int, logits: torch.Tensor) -> torch.Tensor:
        probs.append(probabilities(logits, params))  # (R, V)
        tokens.append(draw_token(probs[-1], uniforms[:, k], params))
        return tokens[-1]

    _, confs = head_loop(step, u, h, first, draw)
    if not tokens:
        R, V = u.shape[0], u.shape[-1]
        return first.new_zeros(R, 0), u.new_zeros(R, 0, V).float(), u.new_zeros(R, 0)
    return torch.stack(tokens, 1), torch.stack(probs, 1), torch.stack(confs, 1)


def markov_block_reference(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
    params: SamplingParams,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Markov stage of a block (the kernel's reference): U (R, γ, V), h (R, γ, dim), x_0 (R,), uniforms
    (R, γ) -> tokens (R, γ), q (R, γ, V) fp32, c (R, γ)."""

    def step(u_k, h_k, prev, state):
        return (*markov_step(u_k, h_k, prev, w1, w2, conf_weight, conf_bias), state)

    return sample_block(step, base_logits, hidden, anchors, params, uniforms)


def markov_block_sample(
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchors: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    conf_weight: torch.Tensor,
    conf_bias: torch.Tensor,
    params: SamplingParams,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`markov_block_reference`, or its Triton kernel where `use_kernel` says so (no top-k/top-p)."""
    full_vocab = w1.shape[0] == base_logits.shape[-1]  # the kernel's layout: a row of W1 per logit
    if params.top_k == 0 and params.top_p == 1.0 and full_vocab and use_kernel(base_logits):
        from dspark_kernels.markov_sampler import markov_block_sample_triton

        return markov_block_sample_triton(
            base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, params.temperature, uniforms
        )
    return markov_block_reference(
        base_logits, hidden, anchors, w1, w2, conf_weight, conf_bias, params, uniforms
    )


class MarkovHead(nn.Module):
    """The Markov head: logits U_k + W2 W1[x_{k-1}], and c_k = σ(wᵀ[h_k; W1[x_{k-1}]]); no state."""

    def __init__(self, n_prev: int, n_out: int, dim: int, rank: int) -> None:
        super().__init__()
        self.w1 = nn.Embedding(n_prev, rank)  # W1[x]: (r,)
        self.w2 = nn.Linear(rank, n_out, bias=False)  # W2: r -> V (or K)
        self.confidence = nn.Linear(dim + rank, 1)  # w of c_k

    def step(self, u_k, h_k, prev, state):
        """(logits (R, V), c_k (R,), the state unchanged)."""
        return (*markov_step(u_k, h_k, prev, *self.weights()), state)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W1 (V, r), W2 (V, r) as nn.Linear stores it, confidence w (dim + r,), its bias (1,))."""
        return self.w1.weight, self.w2.weight, self.confidence.weight[0], self.confidence.bias


class RNNHead(nn.Module):
    """The RNN head: a gated state s (R, r) carries the whole drafted prefix,
    s_k = σ(g) s_{k-1} + (1 − σ(g)) tanh(c), logits U_k + W2 tanh(o), with (g, c, o) from [s; W1[x_{k-1}]; h_k]."""

    def __init__(self, n_prev: int, n_out: int, dim: int, rank: int) -> None:
        super().__init__()
        self.w1 = nn.Embedding(n_prev, rank)
        self.w2 = nn.Linear(rank, n_out, bias=False)
        self.rnn = nn.Linear(rank + rank + dim, 3 * rank)  # [s; W1[x]; h] -> gate, candidate, output
        self.confidence = nn.Linear(dim + rank, 1)

    def step(self, u_k, h_k, prev, state):
        """(logits (R, V), c_k (R,), the new state (R, r)); state None: the block's start, s_0 = 0."""
        e = self.w1(prev)  # (R, r)
        state = e.new_zeros(e.shape) if state is None else state
        gate, cand, out = self.rnn(torch.cat([state, e, h_k], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(gate)
        state = g * state + (1 - g) * torch.tanh(cand)
        conf = torch.sigmoid(self.confidence(torch.cat([h_k, e], dim=-1))).squeeze(-1)
        return u_k + self.w2(torch.tanh(out)), conf, state


HEADS = {"markov": MarkovHead, "rnn": RNNHead}
HEAD_TENSORS = ("w1.", "w2.", "rnn.", "confidence.")  # a checkpoint names them without the "head." prefix


def flat_head_names(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict(): `head.w1.weight` -> `w1.weight` (the layout of the checkpoints and the exporters)."""
    for key in [k for k in state_dict if k.startswith(prefix + "head.")]:
        state_dict[prefix + key[len(prefix) + len("head.") :]] = state_dict.pop(key)


def nested_head_names(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict(): `w1.weight` -> `head.w1.weight`, the other way."""
    for key in [k for k in state_dict if k.startswith(tuple(prefix + n for n in HEAD_TENSORS))]:
        state_dict[prefix + "head." + key[len(prefix) :]] = state_dict.pop(key)


@dataclass
class ParallelDrafterConfig:
    kind: str = "dspark"  # "dflash" (no sequential head), "dspark" (Markov head), "dspark-rnn"
    gamma: int = 7  # block size: draft slots per round
    n_layers: int = 2  # backbone layers
    ffn_hidden: int = 688  # SwiGLU width of each backbone layer
    rank: int = 64  # r of W1 (V x r) and W2 (r x V); 0 for dflash
    mask_id: int = SPECIAL_TOKENS.index(MASK)  # token that fills the γ-1 future slots (<|mask|>)
    draft_vocab: int = 0  # K > 0: the lab's reduced vocabulary of K ids (dspark/lab/draft_vocab.py); 0 = all
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3's q_norm/k_norm)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if self.kind == "dflash":
            self.rank = 0
        if self.kind != "dflash" and self.rank < 1:
            raise ValueError("DSpark's sequential head needs rank >= 1 (rank 0 is the dflash kind)")
        for name in ("gamma", "n_layers", "ffn_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def head(self) -> str:
        return KINDS[self.kind]

    def to_dict(self) -> dict:
        return asdict(self)


class ParallelDrafter(Drafter):
    def __init__(self, target: Transformer, config: ParallelDrafterConfig) -> None:
        super().__init__()
        tc = target.config
        self.config, self.name, self.max_gamma = config, config.kind, config.gamma
        self.layer_config = tc.drafter_layers(config.n_layers, config.ffn_hidden, config.gamma + 1)
        self.ctx_proj = nn.Linear(len(tc.tap_layers) * tc.dim, tc.dim, bias=False)  # W_c
        self.ctx_norm = RMSNorm(tc.dim, tc.norm_eps)
        self.layers = nn.ModuleList(Block(self.layer_config, config.qk_norm) for _ in range(config.n_layers))
        self.out_norm = RMSNorm(tc.dim, tc.norm_eps)
        # the sequential head + confidence head (none in DFlash)
        self.head = None
        if config.head != "none":
            self.head = HEADS[config.head](tc.vocab_size, tc.vocab_size, tc.dim, config.rank)
        self.register_state_dict_post_hook(flat_head_names)
        self.register_load_state_dict_pre_hook(nested_head_names)
        cos, sin = rope_table(self.layer_config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._target = (target,)  # frozen, shared; kept out of state_dict
        if not 0 <= config.mask_id < tc.vocab_size:
            raise ValueError(f"mask_id {config.mask_id} outside the target's vocabulary")
        self.mask_id = config.mask_id
        self.cache: KVCache | None = None
        self.has_confidence = config.head != "none"
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        if self.head is not None:
            nn.init.zeros_(self.head.w2.weight)  # the sequential term starts as a no-op on top of U

    @property
    def target(self) -> Transformer:
        return self._target[0]

    # ---- context features and their keys/values ------------------------------------------
    def context_features(self, features: TargetFeatures) -> torch.Tensor:
        """H_ctx (N, dim) = RMSNorm(W_c [taps])."""
        return self.ctx_norm(self.ctx_proj(features.flat()))

    def context_kv(self, layer: Block, h_ctx: torch.Tensor, positions: torch.Tensor):
        """Keys/values (..., Hkv, hd) of context features through `layer`'s own projections."""
        attn = layer.attn
        cos, sin = self.rope_cos[positions, None], self.rope_sin[positions, None]
        v = attn.wv(h_ctx).unflatten(-1, (attn.n_kv_heads, attn.head_dim))
        return attn.rotated_keys(h_ctx, cos, sin), v

    def backbone(self, block_tokens, block_pos, ctx_k, ctx_v, visible) -> torch.Tensor:
        """block_tokens, block_pos (R, S) (one block, or packed blocks in training); ctx_k/ctx_v per layer
        (R, Hkv, L, hd); visible (R, S, L + S): what each slot may attend to. Returns h (R, S, dim)."""
        x = self.target.embed(block_tokens)
        cos, sin = self.rope_cos[block_pos, None], self.rope_sin[block_pos, None]  # (R, S, 1, hd/2)
        mask = visible[:, None]  # (R, 1, S, L + S)
        for layer, k_ctx, v_ctx in zip(self.layers, ctx_k, ctx_v):
            x = x + layer.attn.forward_masked(layer.attn_norm(x), cos, sin, k_ctx, v_ctx, mask)
            x = x + layer.ffn(layer.ffn_norm(x))
        return x

    # ---- the sequential stage ---------------------------------------------------------------
    def sequential_logits(self, u_k, h_k, prev, state):
        """One left-to-right step: (logits (R, V), confidence (R,) or None for DFlash, new state)."""
        if self.head is None:
            return u_k, None, state
        return self.head.step(u_k, h_k, prev, state)

    # ---- inference ------------------------------------------------------------------------------
    def reset(self, n_slots: int) -> None:
        w = self.ctx_proj.weight
        self.cache = KVCache.for_model(self.layer_config, n_slots, w.dtype, w.device)

    def release(self, slot: int) -> None:
        self.cache.lengths[slot] = 0

    def append_context(
        self, slots: torch.Tensor, features: TargetFeatures, committed_lens: torch.Tensor
    ) -> int:
        """Cache the context keys/values of newly committed positions; returns the longest context."""
        # host sync: shapes, room check, longest context
        rb = RaggedIndex.build(slots, committed_lens, self.cache.lengths[slots], self.cache.max_seq_len)
        h_ctx = self.context_features(features)
        for i, layer in enumerate(self.layers):
            k, v = self.context_kv(layer, h_ctx, rb.positions)
            self.cache.keys[i][rb.token_slot, :, rb.positions] = k
            self.cache.values[i][rb.token_slot, :, rb.positions] = v
        self.cache.advance(slots, committed_lens)
        return rb.kv_len

    def draft_block(self, slots: torch.Tensor, anchors: torch.Tensor, gamma: int, longest: int | None = None):
        """One backbone pass over [anchor, MASK × (γ−1)]: (h (R, γ, dim), U (R, γ, V))."""
        R, device = slots.shape[0], slots.device
        ctx_len = self.cache.lengths[slots]  # (R,) = the anchor's position
        L = longest if longest is not None else ctx_len.max().tolist()  # host sync only without `longest`
        block = torch.full((R, gamma), self.mask_id, dtype=torch.long, device=device)
        block[:, 0] = anchors
        block_pos = ctx_len[:, None] + torch.arange(gamma, device=device)  # (R, γ)
        ctx_k = [self.cache.keys[i][slots, :, :L] for i in range(len(self.layers))]
        ctx_v = [self.cache.values[i][slots, :, :L] for i in range(len(self.layers))]
        before_anchor = torch.arange(L, device=device)[None, :] < ctx_len[:, None]  # (R, L)
        before_anchor = before_anchor[:, None, :].expand(R, gamma, L)
        inside = torch.ones(R, gamma, gamma, dtype=torch.bool, device=device)  # bidirectional in the block
        h = self.backbone(block, block_pos, ctx_k, ctx_v, torch.cat([before_anchor, inside], dim=-1))
        return self.block_outputs(h)

    def block_outputs(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(h), the heads' input; U = LMHead(RMSNorm(h)), the target's frozen head)."""
        normed = self.out_norm(h)
        return normed, self.target.lm_head(normed)

    @torch.no_grad()
    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        if self.cache is None:
            raise RuntimeError("call reset(n_slots) before propose")
        longest = self.append_context(slots, features, committed_lens)
        h, u = self.draft_block(slots, anchors, gamma, longest)
        # position-major, so every head consumes the generator alike (rank-0 DSpark == DFlash)
        uniforms = generator_uniforms((gamma, slots.shape[0]), generator, slots.device).T  # (R, γ)
        return Proposal(*self.sample_head(u, h, anchors, params, uniforms.contiguous()))

    def sample_head(
        self,
        u: torch.Tensor,
        h: torch.Tensor,
        anchors: torch.Tensor,
        params: SamplingParams,
        uniforms: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The sequential stage of a block: U (R, γ, V), h (R, γ, dim), x_0 = anchors (R,), uniforms (R, γ) ->
        tokens (R, γ), q (R, γ, V) fp32, c (R, γ) (None for DFlash)."""
        if self.config.rank == 0:  # DFlash: no dependence between positions, sample the block at once
            q = probabilities(u, params)  # (R, γ, V)
            return draw_token(q, uniforms, params), q, None
        if self.config.head == "markov":  # the whole block in one call (a Triton kernel on CUDA)
            return markov_block_sample(u, h, anchors, *self.head.weights(), params, uniforms)
        return sample_block(self.head.step, u, h, anchors, params, uniforms)  # the RNN head
