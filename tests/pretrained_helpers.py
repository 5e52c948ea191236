"""Tiny pretrained-style checkpoints the tests make themselves: a random Llama written as a GGUF file (with the
`gguf` writer, quantised and float tensors, q/k permuted as llama.cpp's converter does) and as a Hugging
Face-layout folder, with a ChatML byte-level BPE tokenizer trained on a few lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from dspark.lab.pretrained.llama import permute_rotary
from dspark.model import ModelConfig, Transformer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYSTEM = "You are a tiny test model"
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXTS = [
    "def f(x):\n    return x * 2\n",
    "The capital of France is Paris. 12345 + 678 = 13023",
    "naïve café 東京",
] * 30


def chatml_tokenizer(vocab_size: int = 400) -> HFTokenizer:
    """Byte-level BPE with SmolLM2's split (every digit alone) and ChatML control tokens at ids 0..2."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(TEXTS, trainer=trainer)
    return tok


def tiny_llama(vocab_size: int, tied: bool = True, seed: int = 0) -> Transformer:
    """A random Llama whose attention is far from uniform (q/k at std 0.3), so a wrong q/k order shows."""
    config = ModelConfig(vocab_size=vocab_size, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96,
                         max_seq_len=128, rope_theta=50000.0, norm_eps=1e-5, tie_embeddings=tied, tap_layers=(0,))  # fmt: skip
    torch.manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("wq.weight", "wk.weight")):
                p.normal_(0, 0.3)
            elif name == "embed.weight":  # logits with some spread
                p.normal_(0, 0.3)
            elif name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def _vocab_and_merges(tok: HFTokenizer) -> tuple[list[str], list[str]]:
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return [t for t, _ in vocab], merges


def write_gguf(path: Path, model: Transformer, tok: HFTokenizer, quantized: bool = True, arch: str = "llama",
               drop: tuple[str, ...] = (), template: str | None = CHATML_TEMPLATE) -> Path:  # fmt: skip
    """The model as llama.cpp's converter would write it: q/k rows permuted; with `quantized` the embedding
    is Q8_0 and the block matrices Q4_1 (norms stay F32), else everything F32 (the FFN down matrix F16)."""
    import gguf
    from gguf.quants import quantize

    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_seq_len)
    w.add_embedding_length(c.dim)
    w.add_feed_forward_length(c.ffn_hidden)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_rope_dimension_count(c.head_dim)
    w.add_vocab_size(c.vocab_size)
    tokens, merges = _vocab_and_merges(tok)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if template:
        w.add_chat_template(template)
    names = {
        "embed.weight": "token_embd.weight",
        "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    block = {"attn_norm": "attn_norm", "attn.wq": "attn_q", "attn.wk": "attn_k", "attn.wv": "attn_v",
             "attn.wo": "attn_output", "ffn_norm": "ffn_norm", "ffn.w_gate": "ffn_gate", "ffn.w_up": "ffn_up",
             "ffn.w_down": "ffn_down"}  # fmt: skip
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and c.tie_embeddings:
            continue
        if key.startswith("blocks."):
            _, i, rest = key.split(".", 2)
            name = f"blk.{i}.{block[rest.removesuffix('.weight')]}.weight"
        else:
            name = names[key]
        if name in drop:
            continue
        t = tensor.detach().float()
        if key.endswith("attn.wq.weight"):
            t = permute_rotary(t, c.n_heads)
        elif key.endswith("attn.wk.weight"):
            t = permute_rotary(t, c.n_kv_heads)
        array = t.numpy()
        if quantized and array.ndim == 2:
            qtype = (
                gguf.GGMLQuantizationType.Q8_0
                if name == "token_embd.weight"
                else gguf.GGMLQuantizationType.Q4_1
            )
            w.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
        elif name.endswith("ffn_down.weight"):
            w.add_tensor(name, array.astype(np.float16))
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized_twin(model: Transformer) -> Transformer:
    """What `write_gguf(quantized=True)` stores, as a model: each matrix through quantize + dequantize."""
    import copy

    import gguf
    from gguf.quants import dequantize, quantize

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for key, p in twin.named_parameters():
            if p.dim() != 2:
                continue
            q = gguf.GGMLQuantizationType.Q8_0 if key == "embed.weight" else gguf.GGMLQuantizationType.Q4_1
            array = p.detach().float().numpy()
            p.copy_(torch.from_numpy(dequantize(quantize(array, q), q).reshape(array.shape)))
    return twin


def write_hf_dir(
    folder: Path, model: Transformer, tok: HFTokenizer, template: str | None = CHATML_TEMPLATE
) -> Path:
    """The model in Hugging Face's layout (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)."""
    c = model.config
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
              "hidden_size": c.dim, "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
              "num_key_value_heads": c.n_kv_heads, "intermediate_size": c.ffn_hidden,
              "max_position_embeddings": c.max_seq_len, "rope_theta": c.rope_theta, "rms_norm_eps": c.norm_eps,
              "tie_word_embeddings": c.tie_embeddings, "hidden_act": "silu"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    back = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
            "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn.w_gate": "mlp.gate_proj", "ffn.w_up": "mlp.up_proj", "ffn.w_down": "mlp.down_proj"}  # fmt: skip
    top = {
        "embed.weight": "model.embed_tokens.weight",
        "norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    tensors = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and c.tie_embeddings:
            continue
        if key.startswith("blocks."):
            _, i, rest = key.split(".", 2)
            name = f"model.layers.{i}.{back[rest.removesuffix('.weight')]}.weight"
        else:
            name = top[key]
        tensors[name] = tensor.detach().clone().contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    tok.save(str(folder / "tokenizer.json"))
    settings = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    if template:
        settings["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder
