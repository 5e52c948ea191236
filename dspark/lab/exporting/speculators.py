"""The speculators layout (vllm-project/speculators): DSpark / DFlash, and EAGLE-3, as vLLM loads them.

config.json follows `src/speculators/models/{dspark,eagle3}/config.py`: `speculators_model_type`, the
decoder layer's config nested as `transformer_layer_config`, `draft_vocab_size`, and a
`speculators_config` naming the algorithm, a greedy proposal of γ tokens and the verifier (the target).

  * DSpark and DFlash are both written as "dspark" (DFlash: `markov_rank` 0, no confidence head), with
    `sample_from_anchor` true: the anchor-first block, slot k predicts anchor + k + 1, γ drafts per
    block of γ. speculators' "dflash" type defaults to the 1 + N block (the anchor is the bonus token,
    slot k predicts anchor + k) that this project's drafters were not trained for, and its own config
    warns that vLLM may not run dflash anchor-first. `aux_hidden_state_layer_ids` index
    `hidden_states`: DeepSpec id (this project's tap) + 1, as speculators' DFlash converter converts.
    llama.cpp reads this layout too (PR #26275, `--spec-type draft-dspark`).
  * EAGLE-3: "eagle3" with `layers.0.*` names, `eagle_aux_hidden_state_layer_ids` = tap + 1 and every
    norm flag off (`norm_before_residual` ...: the layer adds its attention to the raw feature).

The tensors are the DeepSpec / EAGLE-3 ones (dspark/lab/exporting/hf_layout.py): same names in speculators.
"""

from __future__ import annotations

from dspark.drafters.autoregressive import AutoregressiveDrafter
from dspark.lab.draft_vocab import vocab_of
from dspark.lab.exporting.deepspec import dspark_fields
from dspark.lab.exporting.fields import (
    ExportInfo,
    eagle3_checks,
    layer_config,
    mask_note,
    parallel_checks,
    readme,
    shell,
    speculative_config,
    vocab_note,
)
from dspark.lab.exporting.hf_layout import eagle3_tensors, parallel_tensors

NAME = "speculators"


def speculators_config(algorithm: str, tokens: int, info: ExportInfo) -> dict:
    """The algorithm, a greedy proposal of `tokens` drafts, and the verifier the engine loads."""
    return {
        "algorithm": algorithm,
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                              "accept_tolerance": 0.0}],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": info.target_ref, "architectures": ["LlamaForCausalLM"]},
    }  # fmt: skip


def build(drafter, info: ExportInfo) -> tuple[dict, dict, str]:
    """(config.json, tensors, README.md) in the speculators layout, or ValueError (one line)."""
    if isinstance(drafter, AutoregressiveDrafter) and drafter.config.kind == "eagle":
        return build_eagle3(eagle3_checks(drafter, NAME), info)
    parallel_checks(drafter, NAME)
    cfg = drafter.config
    aux = [t + 1 for t in drafter.target.config.tap_layers]
    config = {
        "architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
        "speculators_config": speculators_config("dspark", cfg.gamma, info),
        "transformer_layer_config": layer_config(drafter, cfg.n_layers, cfg.ffn_hidden, info, "qwen3")
        | {"layer_types": ["full_attention"] * cfg.n_layers},
        "draft_vocab_size": vocab_of(drafter).n_out, "target_hidden_size": None,
        "aux_hidden_state_layer_ids": aux, "sliding_window_non_causal": False, "sample_from_anchor": True,
        **dspark_fields(drafter, info), "tie_word_embeddings": False, "torch_dtype": info.dtype,
    }  # fmt: skip
    config.setdefault("markov_head_type", "vanilla")  # DFlash (rank 0): the fields speculators defaults to
    config.setdefault("confidence_head_with_markov", False)
    facts = [
        f"Layout: speculators `dspark` ({'DFlash: markov_rank 0' if not cfg.rank else 'vanilla Markov head'}), "
        f"Qwen3 layers: {cfg.n_layers}, with per-head q/k RMSNorm.",
        f"Block: `sample_from_anchor` true (anchor-first): slot k predicts anchor + k + 1, {cfg.gamma} drafts "
        f"per block of `block_size` {cfg.gamma}.",
        f"`aux_hidden_state_layer_ids` {aux}: hidden_states indices, each tap layer + 1.",
        mask_note(drafter, info),
        vocab_note(drafter),
        "Engines: this speculators folder loads in vLLM, a reduced draft vocabulary included (`draft_vocab_size`, "
        "`d2t`, `t2d`), and llama.cpp (`draft-dspark`) reads its DSpark; DeepSpec's own loader takes `--format "
        "deepspec`, whole vocabulary only.",
    ]
    return config, parallel_tensors(drafter), readme("DSpark drafter, speculators layout", drafter, info, facts,
                                                     commands(info, cfg.gamma, "dspark"))  # fmt: skip


def build_eagle3(drafter: AutoregressiveDrafter, info: ExportInfo) -> tuple[dict, dict, str]:
    """An EAGLE drafter with EAGLE-3's layer as speculators "eagle3" (`layers.0.*`)."""
    cfg = drafter.config
    aux = [t + 1 for t in drafter.target.config.tap_layers]
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_config": speculators_config("eagle3", cfg.max_gamma, info),
        "transformer_layer_config": layer_config(drafter, 1, cfg.ffn_hidden, info, "llama"),
        "draft_vocab_size": vocab_of(drafter).n_out, "norm_before_residual": False, "norm_before_fc": False,
        "fc_norm": False, "norm_output": False, "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": aux, "tie_word_embeddings": False, "torch_dtype": info.dtype,
    }  # fmt: skip
    facts = [
        "Layout: speculators `eagle3`, one Llama layer whose q/k/v read [RMSNorm(emb); RMSNorm(feature)] "
        "(2 x hidden) and add to the raw feature; every norm flag off.",
        f"`eagle_aux_hidden_state_layer_ids` {aux}: hidden_states indices, each tap layer + 1.",
        vocab_note(drafter),
        "Engines: this speculators folder loads in vLLM, a reduced draft vocabulary included (`d2t`/`t2d`); "
        "for SGLang export `--format eagle3`.",
    ]
    return config, eagle3_tensors(drafter, "layers.0."), readme("EAGLE-3 drafter, speculators layout", drafter,
                                                                 info, facts, commands(info, cfg.max_gamma, "eagle3"))  # fmt: skip


def commands(info: ExportInfo, gamma: int, method: str) -> str:
    """vLLM (and for DSpark llama.cpp) command lines for a speculators folder."""
    d, t = shell(info.drafter_dir), shell(info.target_ref)
    text = f"""
vLLM reads the verifier from `speculators_config` (`{info.target_ref}`), so the folder alone serves:

    vllm serve {d}

or name both explicitly:

    vllm serve {t} --speculative-config {speculative_config(method, info, gamma)}
"""
    if method == "dspark":
        text += f"""
llama.cpp (PR #26275 reads speculators-format DSpark drafts):

    python convert_hf_to_gguf.py {d} --outtype bf16 --target-model-dir TARGET_DIR --outfile drafter.gguf
    llama-server -m target.gguf -md drafter.gguf --spec-type draft-dspark --spec-draft-n-max {gamma}
"""
    return text
