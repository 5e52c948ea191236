"""A drafter's weights under the names the serving engines load, and back.

Two families of layouts, both safetensors with Hugging Face names:

* parallel drafters (DFlash, DSpark) as DeepSpec's `Qwen3DSparkModel` stores them, which
  the speculators format shares (`parallel_tensors` / `load_parallel`):

      layers.N.input_layernorm, layers.N.self_attn.{q,k,v,o}_proj, layers.N.self_attn.{q,k}_norm,
      layers.N.post_attention_layernorm, layers.N.mlp.{gate,up,down}_proj       (this project: layers.N.*)
      norm (out_norm), fc [H, n_taps·H] (ctx_proj), hidden_norm (ctx_norm), embed_tokens, lm_head
      markov_head.markov_w1 [V_target, r]   W1 indexed by TARGET ids: this project's W1 rows are draft
                                            indices plus one "other" row, so every id outside the draft
                                            vocabulary gets that row
      markov_head.markov_w2 [V_draft, r], markov_head.joint_proj (the RNN head), confidence_head.proj

* the EAGLE-3 drafter with EAGLE-3's own layer (`eagle3_tensors` / `load_eagle3`): `fc` [H, 3·H],
  `midlayer.*` (or `layers.0.*`) with q/k/v reading 2·H, `midlayer.{input_layernorm,hidden_norm}`
  (token_norm, feature_norm), `norm`, `lm_head`.

A reduced draft vocabulary is written in ascending target-id order, as `d2t`/`t2d` require:
`d2t` (int64 [K]) with target = i + d2t[i], `t2d` (bool [V]) marking the K ids; `lm_head` and
`markov_w2` rows are permuted alike. This project keeps its ids most frequent first (the order
inverse-CDF sampling walks), so a reader may pass the original order back (`order`) to get the same
draws for the same uniforms, not only the same distribution.

What this file does not do: config.json, READMEs or files (dspark/lab/exporting/ writes them,
exported.py reads them), or check that a folder fits a target (exported.py does).
"""

from __future__ import annotations

import torch

from dspark.checkpoint import CheckpointError, mismatch
from dspark.drafters.autoregressive import AutoregressiveDrafter
from dspark.drafters.parallel import ParallelDrafter
from dspark.lab.draft_vocab import WholeVocabulary as Vocabulary
from dspark.lab.draft_vocab import vocab_of
from dspark.lab.pretrained.llama import BLOCK_NAMES  # Llama block tensor names: HF suffix -> ours

# this project's per-layer key -> the Hugging Face suffix (Llama's, plus Qwen3's per-head q/k norms)
LAYER_NAMES = {ours: hf for hf, ours in BLOCK_NAMES.items()} | {
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
}
PARALLEL_TOP = {"out_norm.weight": "norm.weight", "ctx_proj.weight": "fc.weight",
                "ctx_norm.weight": "hidden_norm.weight"}  # fmt: skip
EAGLE3_TOP = {"fuse.weight": "fc.weight", "out_norm.weight": "norm.weight"}
EAGLE3_LAYER = {  # the EAGLE-3 layer's keys (its input norms are the drafter's) -> suffix after the prefix
    "token_norm.weight": "input_layernorm.weight",
    "feature_norm.weight": "hidden_norm.weight",
    **{f"layers.0.{k}": LAYER_NAMES[k] for k in ("attn.wq.weight", "attn.wk.weight", "attn.wv.weight",
                                                  "attn.wo.weight", "ffn_norm.weight", "ffn.w_gate.weight",
                                                  "ffn.w_up.weight", "ffn.w_down.weight")},
}  # fmt: skip


def sorted_order(vocab: Vocabulary) -> torch.Tensor:
    """(K,) the draft indices in ascending target-id order (K = 0: empty)."""
    return torch.argsort(vocab.ids) if vocab.size else torch.empty(0, dtype=torch.long, device="cpu")


def vocabulary_tensors(vocab: Vocabulary) -> dict[str, torch.Tensor]:
    """`d2t` int64 (K,) and `t2d` bool (V,) of a reduced draft vocabulary, ids ascending; {} without one."""
    if not vocab.size:
        return {}
    ids = vocab.ids[sorted_order(vocab)].cpu()
    t2d = torch.zeros(vocab.target_vocab, dtype=torch.bool, device=ids.device)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(vocab.size, device=ids.device), "t2d": t2d}


def head_rows(vocab: Vocabulary) -> torch.Tensor:
    """`lm_head` (K or V, dim): the target's head rows the drafter scores, ids ascending."""
    rows = vocab.output_rows().detach()
    return rows[sorted_order(vocab).to(rows.device)] if vocab.size else rows


def parallel_tensors(drafter: ParallelDrafter) -> dict[str, torch.Tensor]:
    """Every tensor of the DeepSpec layout for `drafter` (see the module docstring), fp32 on the CPU."""
    out = {hf: drafter.state_dict()[ours] for ours, hf in PARALLEL_TOP.items()}
    for i, layer in enumerate(drafter.layers):
        out |= {f"layers.{i}.{LAYER_NAMES[k]}": v for k, v in layer.state_dict().items()}
    out["embed_tokens.weight"] = drafter.target.embed.weight
    out["lm_head.weight"] = head_rows(vocab_of(drafter))
    out |= vocabulary_tensors(vocab_of(drafter))
    if drafter.config.head != "none":
        if drafter.config.head == "markov":
            w1, w2, conf_w, conf_b = drafter.head.weights()
        else:
            w1, w2 = drafter.head.w1.weight, drafter.head.w2.weight
            conf_w, conf_b = drafter.head.confidence.weight[0], drafter.head.confidence.bias
            out["markov_head.joint_proj.weight"] = drafter.head.rnn.weight
            out["markov_head.joint_proj.bias"] = drafter.head.rnn.bias
        row_of_id = vocab_of(drafter).to_draft(torch.arange(vocab_of(drafter).target_vocab, device=w1.device))
        out["markov_head.markov_w1.weight"] = w1[
            row_of_id
        ]  # (V, r): the ids off the vocabulary share "other"
        order = sorted_order(vocab_of(drafter)).to(w2.device)
        out["markov_head.markov_w2.weight"] = w2[order] if vocab_of(drafter).size else w2
        out["confidence_head.proj.weight"] = conf_w[None]
        out["confidence_head.proj.bias"] = conf_b
    return on_cpu(out)


def eagle3_tensors(drafter: AutoregressiveDrafter, prefix: str = "midlayer.") -> dict[str, torch.Tensor]:
    """Every tensor of the EAGLE-3 layout for an EAGLE drafter built with `eagle3_layer`, fp32 on the CPU."""
    state = drafter.state_dict()
    out = {hf: state[ours] for ours, hf in EAGLE3_TOP.items()}
    out |= {prefix + hf: state[ours] for ours, hf in EAGLE3_LAYER.items()}
    out["lm_head.weight"] = head_rows(vocab_of(drafter))
    out |= vocabulary_tensors(vocab_of(drafter))
    return on_cpu(out)


def on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached contiguous CPU copies, floating ones in fp32 (the writer casts), ids as they are."""
    return {
        k: (v.detach().float() if v.is_floating_point() else v).cpu().contiguous() for k, v in tensors.items()
    }


def draft_ids(tensors: dict[str, torch.Tensor], target_vocab: int, source: str) -> torch.Tensor | None:
    """The draft vocabulary's target ids (K,) ascending from `d2t` (checked against `t2d`); None if none."""
    if "d2t" not in tensors:
        return None
    d2t = tensors["d2t"].long().flatten()
    ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t
    if (ids[1:] <= ids[:-1]).any() or ids.min() < 0 or ids.max() >= target_vocab:
        raise CheckpointError(f"{source}: d2t does not map draft indices to ascending target ids below "
                              f"{target_vocab}")  # fmt: skip
    t2d = tensors.get("t2d")
    if t2d is not None and (
        t2d.shape != (target_vocab,) or not torch.equal(t2d.bool().nonzero().flatten(), ids)
    ):
        raise CheckpointError(f"{source}: t2d does not mark the ids d2t maps to")
    return ids


def reorder(ids: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Row index into the ascending rows that lists them in `order` (the same ids, any order), or identity."""
    if order is None:
        return torch.arange(ids.shape[0], device=ids.device)
    at = torch.searchsorted(ids, order)
    if order.shape != ids.shape or not torch.equal(ids[at.clamp(max=ids.shape[0] - 1)], order):
        raise CheckpointError("the stored draft-id order does not hold the ids d2t maps to")
    return at


def load_parallel(
    drafter: ParallelDrafter, tensors: dict[str, torch.Tensor], order: torch.Tensor | None
) -> None:
    """Fill a freshly built `drafter` (config from the folder) with DeepSpec-layout `tensors`;
    `order`: the draft ids in the order to keep (None: ascending). CheckpointError on what it cannot hold."""
    vocab, source = vocab_of(drafter), "the folder's weights"
    ids = draft_ids(tensors, vocab.target_vocab, source)
    rows = reorder(ids, order) if ids is not None else None
    if ids is not None:
        vocab.set_ids(ids[rows])
    tensors = Named(tensors)
    state = {ours: tensors[hf] for ours, hf in PARALLEL_TOP.items()}
    for i, layer in enumerate(drafter.layers):
        state |= {f"layers.{i}.{k}": tensors[f"layers.{i}.{LAYER_NAMES[k]}"] for k in layer.state_dict()}
    if drafter.config.head != "none":
        w1 = tensors["markov_head.markov_w1.weight"]  # (V, r) by target id
        if ids is not None:
            outside = torch.ones(vocab.target_vocab, dtype=torch.bool, device="cpu")
            outside[ids] = False
            other = w1[outside]
            if other.shape[0] and not torch.equal(other, other[:1].expand_as(other)):
                raise CheckpointError("markov_w1 gives the ids outside the draft vocabulary different rows; "
                                      "this project's Markov head has one row for all of them")  # fmt: skip
            w1 = torch.cat([w1[vocab.ids], other[:1] if other.shape[0] else w1.new_zeros(1, w1.shape[1])])
        w2 = tensors["markov_head.markov_w2.weight"]
        state |= {"w1.weight": w1, "w2.weight": w2[rows] if rows is not None else w2,
                  "confidence.weight": tensors["confidence_head.proj.weight"],
                  "confidence.bias": tensors["confidence_head.proj.bias"]}  # fmt: skip
        if drafter.config.head == "rnn":
            state |= {"rnn.weight": tensors["markov_head.joint_proj.weight"],
                      "rnn.bias": tensors["markov_head.joint_proj.bias"]}  # fmt: skip
    if vocab.size:
        state["vocab.ids"] = vocab.ids
    load_state(drafter, state)


def load_eagle3(
    drafter: AutoregressiveDrafter, tensors: dict[str, torch.Tensor], order: torch.Tensor | None, prefix: str
) -> None:
    """Fill an EAGLE drafter built with `eagle3_layer` from EAGLE-3-layout `tensors` (`prefix`: "midlayer."
    or "layers.0."); `order` as in `load_parallel`."""
    vocab = vocab_of(drafter)
    ids = draft_ids(tensors, vocab.target_vocab, "the folder's weights")
    if ids is not None:
        vocab.set_ids(ids[reorder(ids, order)])
    tensors = Named(tensors)
    state = {ours: tensors[hf] for ours, hf in EAGLE3_TOP.items()}
    state |= {ours: tensors[prefix + hf] for ours, hf in EAGLE3_LAYER.items()}
    if vocab.size:
        state["vocab.ids"] = vocab.ids
    load_state(drafter, state)


class Named(dict):
    """The folder's tensors by name; a missing one is a CheckpointError naming it, not a KeyError."""

    def __missing__(self, name: str) -> torch.Tensor:
        raise CheckpointError(f"the folder's weights lack {name}, which its config.json implies")


def load_state(drafter, state: dict[str, torch.Tensor]) -> None:
    """`load_state_dict`, a mismatch one CheckpointError line (the first tensor it names)."""
    try:
        drafter.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as exc:
        raise CheckpointError(f"the folder's weights do not fit the drafter its config.json describes "
                              f"({mismatch(exc)})") from None  # fmt: skip
