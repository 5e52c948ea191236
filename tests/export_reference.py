"""An engine's reading of an exported folder, written from the public sources and not from dspark's drafters.

`dspark_logits` runs DeepSpec's `Qwen3DSparkModel` inference (deepspec/modeling/dspark/qwen3/modeling.py,
markov_head.py) from config.json and the safetensors alone, with Hugging Face conventions: RoPE by
rotate_half, `repeat_kv`, a block [anchor, mask, ...] at positions anchor_pos.. whose keys are the
context before the anchor then the block; q/k RMSNorm per head before RoPE; the Markov bias W2 W1[prev];
the draft vocabulary through d2t. It reads the block layout from the config: DeepSpec is anchor-first,
speculators says so with `sample_from_anchor` (false: the 1 + N block, whose drafts are slots 1..B-1).
`eagle3_logits` runs vLLM's `llama_eagle3.py` chain. Both take the previous tokens teacher-forced, and
the target's hidden states the way Hugging Face numbers them (`hidden_states`: 0 the embeddings, i + 1
the output of layer i, the last one final-normed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def hidden_states(target, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Hugging Face's `output_hidden_states` of the target for tokens (T,): n_layers + 1 tensors (T, H)."""
    x = target.embed(tokens[None])
    cos, sin = target.rope_cos[: tokens.shape[0], None], target.rope_sin[: tokens.shape[0], None]
    states = [x[0]]
    for block in target.blocks:
        x = x + block.attn(block.attn_norm(x), cos, sin)
        x = x + block.ffn(block.ffn_norm(x))
        states.append(x[0])
    states[-1] = target.norm(x)[0]
    return states


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x (T, heads, hd) rotated at positions pos (T,), rotate_half style."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = pos[:, None].double() * inv[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().float()[:, None], emb.sin().float()[:, None]
    half = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + half * sin


def attention(w, p: str, lc: dict, x_q, x_kv, pos_q, pos_kv, mask, qk_norm: bool) -> torch.Tensor:
    """Eager GQA attention of one layer `p` (its self_attn.* weights), queries x_q over keys x_kv."""
    nh, nkv, hd, eps = (
        lc["num_attention_heads"],
        lc["num_key_value_heads"],
        lc["head_dim"],
        lc["rms_norm_eps"],
    )
    q = (x_q @ w[p + "self_attn.q_proj.weight"].T).view(-1, nh, hd)
    k = (x_kv @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
    v = (x_kv @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
    if qk_norm:
        q, k = rms(q, w[p + "self_attn.q_norm.weight"], eps), rms(k, w[p + "self_attn.k_norm.weight"], eps)
    q, k = rope(q, pos_q, lc["rope_theta"]), rope(k, pos_kv, lc["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)  # repeat_kv
    scores = torch.einsum("qhd,khd->hqk", q, k) * hd**-0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    return torch.einsum("hqk,khd->qhd", weights, v).flatten(1) @ w[p + "self_attn.o_proj.weight"].T


def mlp(w, p: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T


def to_target(logits: torch.Tensor, w: dict, vocab: int) -> torch.Tensor:
    """(..., K) draft logits -> (..., V) with -inf off the draft vocabulary (target id = i + d2t[i])."""
    if "d2t" not in w:
        return logits
    out = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
    out[..., torch.arange(logits.shape[-1]) + w["d2t"]] = logits
    return out


def read(folder: Path) -> tuple[dict, dict]:
    config = json.loads((folder / "config.json").read_text())
    return config, {
        k: v.float() if v.is_floating_point() else v
        for k, v in load_file(folder / "model.safetensors").items()
    }


@torch.no_grad()
def dspark_logits(folder: Path, target, tokens: torch.Tensor, anchor_pos: int, drafts: torch.Tensor):
    """Draft logits (n, V) and confidences (n,) or None of the block after `tokens[anchor_pos]` (the anchor),
    the previous token of draft k being the anchor, then drafts[k - 1] (teacher-forced)."""
    config, w = read(folder)
    speculators = "speculators_model_type" in config
    lc = config["transformer_layer_config"] if speculators else config
    hs = hidden_states(target, tokens[:anchor_pos])
    ids = [i if speculators else i + 1 for i in (config["aux_hidden_state_layer_ids"] if speculators
                                                  else config["target_layer_ids"])]  # fmt: skip
    ctx = rms(
        torch.cat([hs[i] for i in ids], -1) @ w["fc.weight"].T, w["hidden_norm.weight"], lc["rms_norm_eps"]
    )
    B = config["block_size"]
    anchor_first = config.get("sample_from_anchor", False) if speculators else True
    block = torch.full((B,), config["mask_token_id"])
    block[0] = tokens[anchor_pos]
    x = w["embed_tokens.weight"][block]
    pos_q = anchor_pos + torch.arange(B)
    pos_kv = torch.cat([torch.arange(anchor_pos), pos_q])
    mask = torch.ones(B, anchor_pos + B, dtype=torch.bool)  # context before the anchor, the block both ways
    for i in range(lc["num_hidden_layers"]):
        p, eps = f"layers.{i}.", lc["rms_norm_eps"]
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        x = x + attention(
            w, p, lc, h, torch.cat([ctx, h]), pos_q, pos_kv, mask, p + "self_attn.q_norm.weight" in w
        )
        x = x + mlp(w, p, rms(x, w[p + "post_attention_layernorm.weight"], eps))
    hidden = rms(x, w["norm.weight"], lc["rms_norm_eps"])  # (B, H)
    slots = range(B) if anchor_first else range(1, B)  # the 1 + N block: slot 0 is the bonus token's
    prev = torch.cat([tokens[anchor_pos : anchor_pos + 1], drafts])
    logits, confs = [], []
    for n, k in enumerate(slots):
        u = hidden[k] @ w["lm_head.weight"].T
        if config.get("markov_rank", 0):
            e = w["markov_head.markov_w1.weight"][prev[n]]
            u = u + w["markov_head.markov_w2.weight"] @ e
            z = (
                torch.cat([hidden[k], e]) @ w["confidence_head.proj.weight"][0]
                + w["confidence_head.proj.bias"][0]
            )
            confs.append(torch.sigmoid(z))
        logits.append(to_target(u, w, lc["vocab_size"]))
    return torch.stack(logits), torch.stack(confs) if confs else None


@torch.no_grad()
def eagle3_logits(folder: Path, target, tokens: torch.Tensor, anchor_pos: int, drafts: torch.Tensor):
    """EAGLE-3 draft logits (n + 1, V) for n teacher-forced drafts: the committed positions 0..anchor_pos-1
    (each hidden state with the token after it, the anchor last), then one entry per fed-back draft."""
    config, w = read(folder)
    lc = config.get("transformer_layer_config", config)
    p = "layers.0." if "speculators_model_type" in config else "midlayer."
    eps, H = lc["rms_norm_eps"], lc["hidden_size"]
    hs = hidden_states(target, tokens[:anchor_pos])
    feats = torch.cat([hs[i] for i in config["eagle_aux_hidden_state_layer_ids"]], -1) @ w["fc.weight"].T
    embed = target.embed.weight  # the engines share the target's embedding
    residuals, inputs, positions, logits = [], [], [], []
    nxt = torch.cat([tokens[1:anchor_pos], tokens[anchor_pos : anchor_pos + 1]])  # token after each position
    entries = [(feats[i], nxt[i], i) for i in range(anchor_pos)]
    for k in range(drafts.shape[0] + 1):
        for h, token, pos in entries:
            inputs.append(torch.cat([rms(embed[token], w[p + "input_layernorm.weight"], eps),
                                     rms(h, w[p + "hidden_norm.weight"], eps)]))  # fmt: skip
            residuals.append(h)
            positions.append(pos)
        c, res, pos = torch.stack(inputs), torch.stack(residuals), torch.tensor(positions)
        mask = pos[:, None] >= pos[None, :]
        out = res + attention(
            w, p, lc | {"head_dim": H // lc["num_attention_heads"]}, c, c, pos, pos, mask, False
        )
        out = out + mlp(w, p, rms(out, w[p + "post_attention_layernorm.weight"], eps))
        logits.append(
            to_target(rms(out[-1], w["norm.weight"], eps) @ w["lm_head.weight"].T, w, lc["vocab_size"])
        )
        if k < drafts.shape[0]:
            entries = [(out[-1], drafts[k], anchor_pos + k)]  # its own pre-norm output, the drafted token
    return torch.stack(logits)  # (len(drafts) + 1, V): the first draft, then one per fed-back draft
