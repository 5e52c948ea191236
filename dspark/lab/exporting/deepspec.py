"""The DeepSpec layout: DSpark and DFlash drafters as `Qwen3DSparkModel` (vLLM, SGLang, llama.cpp load it).

config.json is DeepSpec's draft config (deepspec/modeling/dspark/qwen3/config.py builds it): the Qwen3
layer fields at the top level with `architectures: ["Qwen3DSparkModel"]`, `num_target_layers`,
`block_size` (= γ: anchor-first, slot k predicts anchor + k + 1, so a block of γ slots drafts γ tokens),
`target_layer_ids` (this project's tap layers as they are: DeepSpec reads `hidden_states[id + 1]`),
`mask_token_id`, `num_anchors` (a training setting), `markov_rank` (r, the rank of
W1/W2), `markov_head_type` "vanilla", `enable_confidence_head` and `confidence_head_with_markov`. DFlash is
the same model with `markov_rank` 0 and no confidence head (DeepSpec's config/dflash/*.py). Copies of the
block fields sit in `dflash_config` / `dspark_config` too, where SGLang's and vLLM's DFlash loaders look for
them.

The target's whole vocabulary only: DeepSpec sizes `lm_head` and `markov_w2` by `vocab_size` and reads no
`d2t` / `t2d`, so a drafter with a reduced draft vocabulary is refused here (the speculators layout holds
it). Widening it instead -- zero rows off the draft ids -- would give those ids logit 0, not q = 0: a
different distribution than the one trained and measured.

The tensors: dspark/lab/exporting/hf_layout.py `parallel_tensors` (with `embed_tokens` and `lm_head`, which
DeepSpec's checkpoints carry as frozen copies of the target's).
"""

from __future__ import annotations

from dspark.lab.draft_vocab import vocab_of
from dspark.lab.exporting.fields import (
    ExportInfo,
    layer_config,
    mask_note,
    parallel_checks,
    readme,
    refuse,
    shell,
    speculative_config,
    vocab_note,
)
from dspark.lab.exporting.hf_layout import parallel_tensors

NAME = "deepspec"
ENGINES = ("Engines: this folder loads in DeepSpec (`Qwen3DSparkModel`), vLLM (`dspark`), SGLang (`DSPARK`) and "
           "llama.cpp (`draft-dspark`); the layout holds the target's whole vocabulary only (a drafter with a "
           "reduced draft vocabulary exports as `--format speculators`).")  # fmt: skip
DEFAULT_ANCHORS = 16  # num_anchors when the checkpoint does not record its training's anchors per sequence


def dspark_fields(drafter, info: ExportInfo) -> dict:
    """The DSpark fields DeepSpec's config adds to the layer config (anchor-first block of γ slots)."""
    cfg = drafter.config
    rank = cfg.rank
    fields = {"block_size": cfg.gamma, "mask_token_id": cfg.mask_id, "markov_rank": rank,
              "enable_confidence_head": rank > 0}  # fmt: skip
    if rank:
        fields |= {"markov_head_type": "vanilla", "confidence_head_with_markov": True}
    if vocab_of(drafter).size:
        fields["draft_vocab_size"] = vocab_of(drafter).size
    return fields


def whole_vocabulary(drafter) -> None:
    """Refuse a reduced draft vocabulary: DeepSpec's model has vocab_size rows in lm_head and markov_w2."""
    k = vocab_of(drafter).size
    if k:
        refuse(f"the {NAME} layout holds the target's whole vocabulary (DeepSpec sizes lm_head and markov_w2 by "
               f"vocab_size, {vocab_of(drafter).target_vocab}, and reads no d2t/t2d), this drafter scores {k} ids; "
               "export it with --format speculators (draft_vocab_size, d2t, t2d: what vLLM's qwen3_dspark loads)")  # fmt: skip


def build(drafter, info: ExportInfo) -> tuple[dict, dict, str]:
    """(config.json, tensors, README.md) of `drafter` in the DeepSpec layout, or ValueError (one line)."""
    parallel_checks(drafter, NAME)
    whole_vocabulary(drafter)
    cfg, tc = drafter.config, drafter.target.config
    taps = list(tc.tap_layers)
    anchors = (info.meta.get("train_config") or {}).get("anchors_per_seq") or DEFAULT_ANCHORS
    block = dspark_fields(drafter, info)
    config = {
        "architectures": ["Qwen3DSparkModel"],
        **layer_config(drafter, cfg.n_layers, cfg.ffn_hidden, info, "qwen3"),
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers,
        "layer_types": ["full_attention"] * cfg.n_layers,
        "num_target_layers": tc.n_layers, "target_layer_ids": taps, "num_anchors": anchors, **block,
        "dflash_config": {"block_size": cfg.gamma, "mask_token_id": cfg.mask_id, "target_layer_ids": taps},
        "dspark_config": {k: v for k, v in block.items() if k not in ("block_size", "mask_token_id")},
    }  # fmt: skip
    return config, parallel_tensors(drafter), readme_text(drafter, info)


def readme_text(drafter, info: ExportInfo) -> str:
    """README.md: the facts a user serving it needs, and the three engines' command lines."""
    cfg, d, t = drafter.config, shell(info.drafter_dir), shell(info.target_ref)
    head = f"a vanilla Markov head of rank {cfg.rank} and a confidence head" if cfg.rank else (
        "no sequential head (DFlash: markov_rank 0)")  # fmt: skip
    facts = [
        f"Layout: DeepSpec `Qwen3DSparkModel`, Qwen3 layers: {cfg.n_layers} (per-head q/k RMSNorm), {head}.",
        f"Block: anchor-first, `block_size` {cfg.gamma}: slot k (0-based) holds the anchor or the mask and "
        f"predicts anchor + k + 1, so one pass drafts {cfg.gamma} tokens.",
        f"`target_layer_ids` {list(drafter.target.config.tap_layers)}: DeepSpec's ids, read as hidden_states[id + 1].",
        mask_note(drafter, info),
        vocab_note(drafter),
        ENGINES,
    ]
    commands = f"""
vLLM (DSpark, PR #46995; DFlash exported here is the same model with markov_rank 0, so also `dspark`):

    vllm serve {t} --speculative-config {speculative_config("dspark", info, cfg.gamma)}

SGLang (PR #30261):

    python -m sglang.launch_server --model-path {t} --speculative-algorithm DSPARK \\
        --speculative-draft-model-path {d}

llama.cpp (PR #25173): convert the draft with the target's folder, then serve both:

    python convert_hf_to_gguf.py {d} --outtype bf16 --target-model-dir TARGET_DIR --outfile drafter.gguf
    llama-server -m target.gguf -md drafter.gguf --spec-type draft-dspark --spec-draft-n-max {cfg.gamma}
"""
    return readme("DSpark drafter, DeepSpec layout", drafter, info, facts, commands)
