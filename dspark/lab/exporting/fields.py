"""What every export layout shares: the facts about the target, the layer config, refusals, README parts.

`ExportInfo` is what the command knows beyond the drafter: which model the engine must load as the
target (`target_ref`), its full context, the mask token's text, the drafter's source. Layer ids are
converted here once: this project's tap i is the residual stream after decoder layer i, which is
DeepSpec's `target_layer_ids` entry i (it reads `hidden_states[i + 1]`, index 0 the embeddings) and the
speculators / EAGLE-3 id i + 1 (those index `hidden_states` directly; vLLM captures the input of layer
i + 1). A tap on the target's LAST layer is refused everywhere: `hidden_states[n]` is the final-NORMED
state in Hugging Face, not the residual this project taps, and the engines do not capture it.

Every refusal is a `ValueError` with one line (the command prints it and exits non-zero). The READMEs'
command lines pass the target and the folder through `shell`: one shell argument each, whatever they hold.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from dspark.drafters.autoregressive import AutoregressiveDrafter
from dspark.drafters.parallel import ParallelDrafter
from dspark.lab.draft_vocab import vocab_of

# the Hugging Face model a known target of this project is, its own context (the cache here is shorter), and
# what a user serving it should know about the weights the drafter was trained against
KNOWN_TARGETS = {
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", 8192,
                     "This project runs SmolLM2 from its Q4_1 GGUF, dequantised: the drafter learned those features. "
                     "The bf16 Hugging Face weights are close but not equal, so expect a slightly lower acceptance "
                     "with them than with that GGUF."),
}  # fmt: skip
DTYPE_NAMES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


@dataclass
class ExportInfo:
    target_name: str = "custom"  # this project's name of the target: "tiny", a known model's name, "custom"
    target_ref: str = "PATH/TO/TARGET"  # what the engine loads as the target (a Hugging Face id or folder)
    context: int = 0  # the target's context for max_position_embeddings (0: the drafter's target's cache)
    mask_text: str = ""  # the mask token's text in the target's vocabulary
    tokenizer_vocab: int = 0  # ids the tokenizer defines (< vocab_size: the embedding has spare rows)
    source: str = ""  # the drafter checkpoint it came from
    dtype: str = "bfloat16"  # the weights' dtype in the folder
    meta: dict = field(default_factory=dict)  # the drafter checkpoint's training record, when it has one
    note: str = ""  # a sentence on the target's weights (KNOWN_TARGETS), for the README
    drafter_dir: str = "DRAFTER_DIR"  # the folder as the README's commands name it (export_drafter sets it)


def refuse(message: str) -> None:
    """One line, raised: what the command prints before exiting with status 2."""
    raise ValueError(message)


def checked_taps(drafter, layout: str) -> list[int]:
    """The drafter's tap layers (this project's count), refused if `layout` cannot name them."""
    tc = drafter.target.config
    taps = list(tc.tap_layers)
    if any(b <= a for a, b in zip(taps, taps[1:])):
        refuse(f"the {layout} layout needs strictly increasing target layers, this target taps {taps}")
    if taps and taps[-1] == tc.n_layers - 1:
        refuse(f"tap layer {taps[-1]} is the target's last layer, whose output the engines do not capture for a "
               f"drafter (its Hugging Face hidden state is the final-normed one); the {layout} layout cannot "
               "hold it")  # fmt: skip
    return taps


def parallel_checks(drafter, layout: str) -> ParallelDrafter:
    """What the DSpark layouts need of a parallel drafter (q/k norm, a vanilla Markov head)."""
    if isinstance(drafter, AutoregressiveDrafter):
        hint = (
            "for eagle use --format eagle3"
            if drafter.config.kind == "eagle"
            else "no engine layout holds mtp"
        )
        refuse(f"the {layout} layout holds the parallel drafters (dflash, dspark); {hint}")
    cfg = drafter.config
    if not cfg.qk_norm:
        refuse(f"this {cfg.kind} drafter has no per-head q/k RMSNorm, which the {layout} layout requires (the "
               "engines' DSpark drafter is Qwen3's); train one with `python -m dspark.train drafter --kind "
               f"{cfg.kind} --qk-norm`")  # fmt: skip
    if cfg.head == "rnn":
        refuse(f"the {layout} layout is refused for the RNN head: vLLM, SGLang and llama.cpp serve the vanilla "
               "Markov head only (DeepSpec and speculators define markov_head_type rnn, the engines do not)")  # fmt: skip
    checked_taps(drafter, layout)
    return drafter


def eagle3_checks(drafter, layout: str) -> AutoregressiveDrafter:
    """What the EAGLE-3 layouts need: an EAGLE drafter with EAGLE-3's layer, fused from exactly 3 taps."""
    if not isinstance(drafter, AutoregressiveDrafter) or drafter.config.kind != "eagle":
        refuse(f"the {layout} EAGLE-3 layout holds the eagle drafter, not {drafter.config.kind}")
    if not drafter.config.eagle3_layer:
        refuse("this eagle drafter's layer reads W_in[emb; feature] through a pre-norm, not EAGLE-3's 2 x dim "
               f"attention input, so the {layout} layout cannot hold it; train one with `python -m dspark.train "
               "drafter --kind eagle --eagle3-layer`")  # fmt: skip
    taps = checked_taps(drafter, layout)
    if len(taps) != 3:
        refuse(f"EAGLE-3 fuses 3 target layers (fc is [H, 3 x H]), this target taps {len(taps)}")
    return drafter


def layer_config(drafter, n_layers: int, ffn_hidden: int, info: ExportInfo, model_type: str) -> dict:
    """The Qwen3 (or Llama) decoder-layer config of the drafter: the target's width, heads, RoPE θ and ε."""
    tc = drafter.target.config
    return {
        "model_type": model_type, "vocab_size": tc.vocab_size, "hidden_size": tc.dim,
        "intermediate_size": ffn_hidden, "num_hidden_layers": n_layers, "num_attention_heads": tc.n_heads,
        "num_key_value_heads": tc.n_kv_heads, "head_dim": tc.head_dim, "hidden_act": "silu",
        "max_position_embeddings": info.context or tc.max_seq_len, "rms_norm_eps": float(f"{tc.norm_eps:.7g}"),
        "rope_theta": float(tc.rope_theta), "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": False, "use_cache": True,
        "initializer_range": 0.02, "torch_dtype": DTYPE_NAMES[info.dtype],
    }  # fmt: skip


def mask_note(drafter: ParallelDrafter, info: ExportInfo) -> str:
    """One README sentence: which token fills the block's future slots, and why that one."""
    m, text = drafter.config.mask_id, f" (`{info.mask_text}`)" if info.mask_text else ""
    if info.tokenizer_vocab and m >= info.tokenizer_vocab:
        why = "a spare embedding row, which no text produces"
    elif info.mask_text == "<|mask|>":
        why = "this project's tokenizer's own mask token"
    else:
        why = ("a special token prompts never contain: the target's embedding has no spare row for a mask, so "
               "the drafter was trained with this one in the block's future slots")  # fmt: skip
    return f"Mask token: id {m}{text}, {why}; `mask_token_id` carries it, keep it when serving."


def vocab_note(drafter) -> str:
    """One README sentence on the draft vocabulary."""
    k = vocab_of(drafter).size
    if not k:
        return "Vocabulary: the drafter scores the target's whole vocabulary (no d2t/t2d)."
    return (f"Vocabulary: the drafter scores {k} of the target's {vocab_of(drafter).target_vocab} ids; `lm_head` holds "
            "their rows in ascending id order, `d2t` (int64) maps draft index i to target id i + d2t[i], `t2d` "
            "(bool) marks them.")  # fmt: skip


def shell(word: str) -> str:
    """`word` as one shell argument (a --target-ref or a path may hold spaces, `;`, `$(...)`)."""
    return shlex.quote(word)


def speculative_config(method: str, info: ExportInfo, tokens: int) -> str:
    """vLLM's `--speculative-config` value naming the drafter folder: JSON, then quoted as one shell argument."""
    return shell(json.dumps({"method": method, "model": info.drafter_dir, "num_speculative_tokens": tokens}))


def readme(title: str, drafter, info: ExportInfo, facts: list[str], commands: str) -> str:
    """The folder's README.md: what it holds, for which target, and how each engine loads it."""
    tc, taps = drafter.target.config, list(drafter.target.config.tap_layers)
    lines = [
        f"# {title}",
        "",
        f"Written by `python -m dspark.export` from `{info.source or 'a drafter'}` ({drafter.config.kind}), "
        f"trained here against the target `{info.target_name}` ({tc.n_layers} layers, hidden {tc.dim}). Serve "
        f"it with the same target weights: `{info.target_ref}`.",
        "",
        f"- Target layers: this project's tap layers {taps} (the residual stream after decoder layer i).",
        *[f"- {fact}" for fact in facts],
        f"- RoPE θ {tc.rope_theta:g}, RMSNorm ε {tc.norm_eps:g}, written explicitly; `tie_word_embeddings` false.",
        *([f"- {info.note}"] if info.note else []),
        "",
        "## Serving (these command lines were not run here: this project has no GPU server)",
        "",
        commands.strip(),
        "",
    ]  # fmt: skip
    return "\n".join(lines)
