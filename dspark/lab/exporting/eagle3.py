"""The EAGLE-3 layout for Llama targets, as vLLM and SGLang load it (their `llama_eagle3.py`).

The original EAGLE-3 checkpoint format: a Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
`num_hidden_layers` 1, `vocab_size` (the target's) and `draft_vocab_size`, and the tensors `fc` [H, 3·H]
(the fused tap layers), `midlayer.{input_layernorm,hidden_norm}` (the normed token embedding and the
normed feature), `midlayer.self_attn.{q,k,v}_proj` reading their 2·H concatenation, `midlayer.self_attn.o_proj`,
`midlayer.post_attention_layernorm`, `midlayer.mlp.*`, `norm`, `lm_head` [draft_vocab, H] and, with a
reduced vocabulary, `d2t` / `t2d`. No `embed_tokens`: both engines share the target's. The tap layers go
in as `eagle_aux_hidden_state_layer_ids` (tap + 1: vLLM captures the input of layer i + 1, the output
of layer i), at the top level and under `eagle_config`, where SGLang reads them.

Only an EAGLE drafter built with `--eagle3-layer` has this layer (dspark/drafters/autoregressive.py, `Eagle3Layer`).
"""

from __future__ import annotations

from dspark.lab.draft_vocab import vocab_of
from dspark.lab.exporting.fields import (
    ExportInfo,
    eagle3_checks,
    layer_config,
    readme,
    shell,
    speculative_config,
    vocab_note,
)
from dspark.lab.exporting.hf_layout import eagle3_tensors

NAME = "eagle3"


def build(drafter, info: ExportInfo) -> tuple[dict, dict, str]:
    """(config.json, tensors, README.md) of an EAGLE-3-layer drafter, or ValueError (one line)."""
    eagle3_checks(drafter, NAME)
    cfg = drafter.config
    aux = [t + 1 for t in drafter.target.config.tap_layers]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **layer_config(drafter, 1, cfg.ffn_hidden, info, "llama"),
        "draft_vocab_size": vocab_of(drafter).n_out, "target_hidden_size": drafter.target.config.dim,
        "eagle_aux_hidden_state_layer_ids": aux,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
    }  # fmt: skip
    facts = [
        "Layout: EAGLE-3 (`midlayer.*`), one Llama layer whose q/k/v read [RMSNorm(emb(x_{i+1})); "
        "RMSNorm(g_i)] (2 x hidden) and whose residual is g_i itself; it feeds its pre-norm output back.",
        f"`eagle_aux_hidden_state_layer_ids` {aux}: each tap layer + 1 (the engines capture layer inputs).",
        f"Trained to draft up to {cfg.max_gamma} tokens a round (training-time test over {cfg.max_gamma} steps).",
        vocab_note(drafter),
        "Engines: this folder loads in vLLM (`eagle3`) and SGLang (`EAGLE3`), a reduced draft vocabulary "
        "included (`d2t`/`t2d`); llama.cpp was not checked.",
    ]
    d, t, n = shell(info.drafter_dir), shell(info.target_ref), cfg.max_gamma
    commands = f"""
vLLM:

    vllm serve {t} --speculative-config {speculative_config("eagle3", info, n)}

SGLang (a chain: top-k 1, {n} steps, {n + 1} tokens verified):

    python -m sglang.launch_server --model-path {t} --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path {d} --speculative-num-steps {n} --speculative-eagle-topk 1 \\
        --speculative-num-draft-tokens {n + 1}

llama.cpp: not covered by this export (its EAGLE-3 support was not checked here).
"""
    return (
        config,
        eagle3_tensors(drafter, "midlayer."),
        readme("EAGLE-3 drafter", drafter, info, facts, commands),
    )
