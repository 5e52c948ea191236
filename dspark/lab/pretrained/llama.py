"""Turning a pretrained Llama-architecture checkpoint into this project's `Transformer`.

What this file does: the parts that a GGUF file and a Hugging Face-layout
directory share once their tensors are read -- the `ModelConfig` from the
checkpoint's hyperparameters, the renaming of tensors onto the modules of
`dspark.model.Transformer`, loading them with every mismatch named in one
line, and recognising the chat template (ChatML or none).

What it does not do: read files (`gguf_file.py`, `hf_dir.py`) or fetch
them (`fetch.py`). It supports the plain Llama block this project's model
has: RMSNorm, rotate-half RoPE without scaling, SwiGLU, grouped-query
attention, no biases; anything else is refused with one line, never loaded
into wrong logits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from dspark.checkpoint import CheckpointError, mismatch
from dspark.model import ModelConfig, Transformer, rope_table
from dspark.tokenizer import ChatFormat

# Llama block tensor names: Hugging Face suffix -> this project's module path (per layer)
BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn.wq.weight",
    "self_attn.k_proj.weight": "attn.wk.weight",
    "self_attn.v_proj.weight": "attn.wv.weight",
    "self_attn.o_proj.weight": "attn.wo.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn.w_gate.weight",
    "mlp.up_proj.weight": "ffn.w_up.weight",
    "mlp.down_proj.weight": "ffn.w_down.weight",
}

# Context the KV cache is sized for when the caller does not choose one: a real model's own context (8k for
# SmolLM2) would cost 30 layers x 2 x 3 heads x 64 x 8192 x 2 B = 190 MB of bf16 cache per request.
DEFAULT_CONTEXT = 2048


def chatml(system: str | None = None) -> ChatFormat:
    """The ChatML turn format (SmolLM2, Qwen, ...), with an optional system turn first."""
    system_turn = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return ChatFormat(
        "chatml", system_turn + "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>"
    )


def plain(bos: str, eos: str) -> ChatFormat:
    """No chat template (a base model): BOS, then the prompt, and the reply continues it."""
    return ChatFormat("plain", bos, "", eos)


@dataclass
class Hyperparameters:
    """What the checkpoint says about the architecture (names as in Llama)."""

    vocab_size: int  # rows of the embedding
    dim: int  # hidden size
    n_layers: int  # transformer blocks
    n_heads: int  # attention (query) heads
    n_kv_heads: int  # key/value heads
    ffn_hidden: int  # intermediate size of the SwiGLU
    context: int  # the context length the model was trained for
    rope_theta: float  # RoPE base
    norm_eps: float  # RMSNorm epsilon
    tied: bool  # the LM head is the embedding (no separate output matrix)


def default_tap_layers(n_layers: int, n_taps: int = 3) -> tuple[int, ...]:
    """Evenly spaced from the first block to the third-to-last (walkthrough/DESIGN.md section 2)."""
    last = max(n_layers - 3, 0)
    return tuple(sorted({round(last * i / (n_taps - 1) + 1e-9) for i in range(n_taps)}))


def model_config(hp: Hyperparameters, max_seq_len: int | None = None) -> ModelConfig:
    """The project's config for these hyperparameters; the KV cache holds `max_seq_len` tokens
    (default: the model's context, at most DEFAULT_CONTEXT)."""
    context = max_seq_len or min(hp.context, DEFAULT_CONTEXT)
    if context > hp.context:
        raise CheckpointError(f"a context of {context} tokens exceeds the model's own {hp.context}")
    try:
        return ModelConfig(
            vocab_size=hp.vocab_size, dim=hp.dim, n_layers=hp.n_layers, n_heads=hp.n_heads,
            n_kv_heads=hp.n_kv_heads, ffn_hidden=hp.ffn_hidden, max_seq_len=context,
            rope_theta=float(hp.rope_theta), norm_eps=float(hp.norm_eps), tie_embeddings=hp.tied,
            tap_layers=default_tap_layers(hp.n_layers),
        )  # fmt: skip
    except ValueError as exc:
        raise CheckpointError(f"unsupported architecture ({exc})") from None


def parameter_count(config: ModelConfig) -> int:
    """Parameters of a `Transformer` with `config` (exact, in Python integers: no overflow for absurd sizes)."""
    d, kv = config.dim, config.n_kv_heads * config.head_dim
    block = 2 * d * d + 2 * d * kv + 3 * d * config.ffn_hidden + 2 * d  # attention, SwiGLU, two norms
    heads = 1 if config.tie_embeddings else 2  # the embedding, and the LM head unless tied to it
    return heads * config.vocab_size * d + config.n_layers * block + d


def available_memory() -> int | None:
    """Bytes of memory this process may still take: MemAvailable of /proc/meminfo (Linux), else the free
    physical pages; None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(config: ModelConfig, source: object, bytes_per_parameter: int = 4) -> None:
    """Refuse, in one line and before anything is allocated, a model whose fp32 weights would not fit in the
    memory available (a config.json with absurd sizes would otherwise allocate until the process dies)."""
    count, free = parameter_count(config), available_memory()
    need = count * bytes_per_parameter
    if free is not None and need > free:
        raise CheckpointError(f"{source}: {count:,} parameters need {need / 2**30:,.1f} GiB in fp32, more than the "
                              f"{free / 2**30:,.1f} GiB of memory available")  # fmt: skip


def unpermute_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a q or k projection (out_features, in_features).

    Its converter interleaves each head's rows (row pairs (0, hd/2), (1, hd/2+1), ... become
    adjacent) so that RoPE can rotate neighbouring pairs; this model rotates the two halves of
    each head, as the Hugging Face checkpoints do. `permute_rotary` is the converter's direction."""
    out = weight.shape[0]
    return (
        weight.reshape(n_heads, out // n_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def permute_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to q/k (the inverse of `unpermute_rotary`; the tests write GGUF with it)."""
    out = weight.shape[0]
    return (
        weight.reshape(n_heads, 2, out // n_heads // 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def build_model(config: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> Transformer:
    """A `Transformer` holding `tensors` (already renamed to its state-dict keys), in eval mode, fp32. Weights
    that are not floating-point (integers, booleans) are refused, not cast."""
    integral = [
        f"{k} ({str(v.dtype).removeprefix('torch.')})"
        for k, v in tensors.items()
        if not v.is_floating_point()
    ]
    if integral:
        raise CheckpointError(f"{source}: weights must be floating-point, got {', '.join(integral[:3])}")
    check_memory(config, source)
    with torch.device("meta"):  # no random init of 135 M parameters that are overwritten at once
        model = Transformer(config)
    model = model.to_empty(device="cpu")
    state = {k: v.float() for k, v in tensors.items()}
    expected = set(model.state_dict())
    if config.tie_embeddings:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)  # a tied checkpoint may still store the copy
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(f"{source} does not hold a Llama model this project can run "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")  # fmt: skip
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise CheckpointError(f"{source} does not match its own hyperparameters ({mismatch(exc)})") from None
    if config.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope_cos, model.rope_sin = rope_table(config)  # buffers made on the meta device: recompute
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise CheckpointError(f"{source} holds NaN/inf weights (in {bad[:3]})")
    return model.eval()


TOP_NAMES = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "lm_head.weight"}  # fmt: skip


def rename_hf(name: str) -> str | None:
    """Hugging Face Llama tensor name -> state-dict key (None: not a tensor this model has)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
    if m and m.group(2) in BLOCK_NAMES:
        return f"blocks.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}"
    return None


def chat_format(template: str | None, specials: set[str], bos: str | None, eos: str | None) -> ChatFormat:
    """Recognise the model's chat template: ChatML (with its default system turn, if the template
    writes one) or none (a base model: the prompt after BOS, stop at EOS). Others are refused."""
    if template and "<|im_start|>" in template:
        if not {"<|im_start|>", "<|im_end|>"} <= specials:
            raise CheckpointError(
                "the chat template is ChatML but the vocabulary lacks <|im_start|>/<|im_end|>"
            )
        default = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
        return chatml(default.group(1) if default else None)
    if template:
        raise CheckpointError("unsupported chat template (this project knows ChatML and no template)")
    if bos is None or eos is None:
        raise CheckpointError("a model without a chat template needs BOS and EOS tokens")
    return plain(bos, eos)
