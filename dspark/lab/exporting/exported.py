"""Reading a drafter folder in a serving engine's layout back into this project (`--drafter-checkpoint DIR`).

A folder holds `config.json` and `*.safetensors` (Hugging Face style); which layout it is comes from
config.json:

  * DeepSpec / vLLM / SGLang DSpark and DFlash: `architectures` names `Qwen3DSparkModel`; the Qwen3 layer
    fields and the DSpark fields (`block_size`, `target_layer_ids`, `mask_token_id`, `markov_rank`, ...)
    sit at the top level. `target_layer_ids` counts as this project's `tap_layers` do: id i is the output
    of decoder layer i (DeepSpec reads `hidden_states[i + 1]`, index 0 being the embeddings).
  * speculators DSpark / DFlash: `speculators_model_type` "dspark" or "dflash", the layer fields under
    `transformer_layer_config`; `aux_hidden_state_layer_ids` index `hidden_states` (= DeepSpec id + 1),
    and `sample_from_anchor` must be true (anchor-first: slot k predicts anchor + k + 1, this project's
    block; false is DFlash's 1 + N block, where slot k predicts anchor + k).
  * EAGLE-3 (`LlamaForCausalLMEagle3`, `midlayer.*`) or speculators "eagle3" (`layers.0.*`): an EAGLE
    drafter with EAGLE-3's layer; its layer ids are `hidden_states` indices too.

It is a drafter for THIS target only if the folder says so: width, heads, vocabulary, RoPE θ, norm ε,
tap layers, and the embedding and LM-head rows it ships must all be the target's (this project's
drafters borrow them frozen); any difference, and anything the project's drafters cannot hold (a gated
Markov head, a DSpark head without its confidence head, sliding-window layers, biases, RoPE scaling),
is one `CheckpointError` line. `dspark.json`, written by `python -m dspark.export`, gives back what the
layouts do not keep: the draft ids' own order (most frequent first, the order sampling walks) and the
EAGLE drafter's block length.

What this file does not do: write folders (dspark/lab/exporting/), or name tensors (hf_layout.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dspark import drafters
from dspark.checkpoint import CheckpointError
from dspark.device import model_device
from dspark.drafters.autoregressive import AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter
from dspark.drafters.parallel import ParallelDrafterConfig
from dspark.lab.cpu_speed import fast_on_cpu
from dspark.lab.draft_vocab import build_drafter, load_checkpoint, vocab_of
from dspark.lab.exporting.hf_layout import draft_ids, head_rows, load_eagle3, load_parallel
from dspark.lab.prompt_lookup import PromptLookupDrafter
from dspark.model import Transformer, cast_keeping_rope

HEAD_KINDS = {
    0: "dflash",
    "vanilla": "dspark",
    "rnn": "dspark-rnn",
}  # markov_rank 0 / markov_head_type -> kind
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def read_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(config.json, every tensor of its *.safetensors, dspark.json or {}), or CheckpointError."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        sidecar = folder / "dspark.json"
        extra = json.loads(sidecar.read_text(encoding="utf-8")) if sidecar.is_file() else {}
    except FileNotFoundError:
        raise CheckpointError(f"{folder} has no config.json: not a drafter folder") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{folder}: config.json or dspark.json is not valid JSON ({exc})") from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors weights")
    tensors = {}
    for f in files:
        try:
            tensors |= load_file(str(f))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{f} is corrupt or truncated ({exc})") from None
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(f"{folder} holds NaN/inf weights (in {bad[:3]})")
    return config, tensors, extra if isinstance(extra, dict) else {}


def check_layers(layer: dict, target: Transformer, folder: Path) -> None:
    """The drafter's decoder layers must be this target's width, heads and RoPE (its layer config)."""
    tc = target.config
    want = {"hidden_size": tc.dim, "num_attention_heads": tc.n_heads, "num_key_value_heads": tc.n_kv_heads,
            "head_dim": tc.head_dim, "vocab_size": tc.vocab_size}  # fmt: skip
    for name, value in want.items():
        if layer.get(name, value) != value:
            raise CheckpointError(f"{folder} is a drafter for another target: its {name} is {layer.get(name)}, "
                                  f"this target's {value}")  # fmt: skip
    for name, value in (("rope_theta", tc.rope_theta), ("rms_norm_eps", tc.norm_eps)):
        got = layer.get(name, value)
        if not isinstance(got, (int, float)) or not math.isclose(got, value, rel_tol=1e-4):
            raise CheckpointError(f"{folder}: its {name} is {got}, this target's {value}")
    scaling = layer.get("rope_scaling") or {}
    unsupported = [
        what for what, bad in (
            ("RoPE scaling", scaling.get("rope_type", scaling.get("type", "default")) != "default"),
            ("biases", layer.get("attention_bias") or layer.get("mlp_bias")),
            ("sliding-window layers", layer.get("use_sliding_window") or any(
                t != "full_attention" for t in layer.get("layer_types") or [])),
            (f"the {layer.get('hidden_act')} activation", layer.get("hidden_act", "silu") != "silu"),
        ) if bad
    ]  # fmt: skip
    if unsupported:
        raise CheckpointError(f"{folder}: this project's drafter layers have no {unsupported[0]}")


def check_taps(layer_ids: list[int], target: Transformer, folder: Path) -> None:
    """The target layers the drafter reads, as this project counts them, must be this target's taps."""
    taps = tuple(target.config.tap_layers)
    if tuple(layer_ids) != taps:
        raise CheckpointError(f"{folder} reads target layers {list(layer_ids)} (counted as --taps counts), but "
                              f"this target taps {list(taps)}; pass the target it was made for")  # fmt: skip


def check_borrowed(tensors: dict[str, torch.Tensor], drafter: Drafter, folder: Path) -> None:
    """The embedding and LM-head rows a folder ships must be the target's own (within bf16 rounding)."""
    target = drafter.target
    pairs = [("embed_tokens.weight", target.embed.weight), ("lm_head.weight", head_rows(vocab_of(drafter)))]
    for name, ours in pairs:
        if name not in tensors:
            continue
        theirs, ours = tensors[name].float(), ours.detach().float().cpu()
        scale = float(ours.abs().max()) or 1.0
        if theirs.shape != ours.shape or float((theirs - ours).abs().max()) > 1e-2 * scale:
            raise CheckpointError(f"{folder}: its {name} is not this target's; this project's drafters borrow "
                                  "the target's embedding and LM head, so it was made for another target")  # fmt: skip


def parallel_drafter(config: dict, tensors: dict, extra: dict, target: Transformer, folder: Path):
    """A DeepSpec- or speculators-layout DSpark/DFlash folder -> (ParallelDrafter, draft-id order or None)."""
    speculators = "speculators_model_type" in config
    layer = config.get("transformer_layer_config", {}) if speculators else config
    check_layers(layer, target, folder)
    if speculators:
        if not config.get("sample_from_anchor", False):
            raise CheckpointError(f"{folder} uses the 1 + N block (sample_from_anchor false: slot k predicts "
                                  "anchor + k); this project's drafters are anchor-first (slot k predicts "
                                  "anchor + k + 1)")  # fmt: skip
        layer_ids = [i - 1 for i in config.get("aux_hidden_state_layer_ids") or []]
    else:
        layer_ids = list(config.get("target_layer_ids") or [])
    check_taps(layer_ids, target, folder)
    rank = int(config.get("markov_rank", 0) or 0)
    head = config.get("markov_head_type", "vanilla") if rank else 0
    if head not in HEAD_KINDS:
        raise CheckpointError(f"{folder}: this project has no {head!r} Markov head (only vanilla and rnn)")
    confident = bool(config.get("enable_confidence_head", False))
    if confident != bool(rank) or (confident and not config.get("confidence_head_with_markov", True)):
        raise CheckpointError(f"{folder}: this project's DSpark heads always carry a confidence head reading "
                              "[h; W1[prev]] and DFlash none; this folder's combination differs")  # fmt: skip
    ids = draft_ids(tensors, target.config.vocab_size, str(folder))
    try:
        drafter_config = ParallelDrafterConfig(
            HEAD_KINDS[head], int(config["block_size"]), int(layer["num_hidden_layers"]),
            int(layer["intermediate_size"]), rank=rank, mask_id=int(config["mask_token_id"]),
            draft_vocab=0 if ids is None else ids.shape[0],
            qk_norm="layers.0.self_attn.q_norm.weight" in tensors,
        )  # fmt: skip
        drafter = build_drafter(target, drafter_config)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: config.json does not describe a drafter this project can build "
                              f"({exc})") from None  # fmt: skip
    return drafter, stored_order(extra, ids)


def eagle3_drafter(config: dict, tensors: dict, extra: dict, target: Transformer, folder: Path):
    """An EAGLE-3 folder (its own layout, or speculators') -> (EAGLE drafter with EAGLE-3's layer, order)."""
    speculators = "speculators_model_type" in config
    layer = config.get("transformer_layer_config", {}) if speculators else config
    check_layers(layer | {"vocab_size": layer.get("vocab_size", target.config.vocab_size)}, target, folder)
    flags = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
    if any(config.get(f) for f in flags):
        raise CheckpointError(f"{folder}: this project's EAGLE-3 layer has none of {', '.join(flags)}")
    ids_field = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")  # fmt: skip
    n = target.config.n_layers
    check_taps([i - 1 for i in ids_field or (2, n // 2, n - 3)], target, folder)  # vLLM's default ids
    ids = draft_ids(tensors, target.config.vocab_size, str(folder))
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    gamma = extra.get("drafter", {}).get("max_gamma") or proposals[0].get("speculative_tokens") or 7
    try:
        drafter_config = AutoregressiveDrafterConfig(
            "eagle", int(gamma), int(layer.get("num_hidden_layers", 1)), int(layer["intermediate_size"]),
            draft_vocab=0 if ids is None else ids.shape[0], eagle3_layer=True,
        )  # fmt: skip
        drafter = build_drafter(target, drafter_config)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder}: config.json does not describe an EAGLE-3 drafter this project can "
                              f"build ({exc})") from None  # fmt: skip
    return drafter, stored_order(extra, ids)


def stored_order(extra: dict, ids: torch.Tensor | None) -> torch.Tensor | None:
    """The draft ids in the order dspark.json keeps (the exported drafter's own), if it matches `ids`."""
    order = extra.get("draft_ids")
    if ids is None or not isinstance(order, list) or len(order) != ids.shape[0]:
        return None
    order = torch.tensor(order, dtype=torch.long, device="cpu")  # read from the folder's JSON
    return order if torch.equal(order.sort().values, ids) else None


def load_exported(folder: str | Path, target: Transformer) -> Drafter:
    """The drafter a folder in one of the layouts above holds, for `target`, on its device and in its dtype."""
    folder = Path(folder)
    config, tensors, extra = read_folder(folder)
    architectures = config.get("architectures") or []
    kind = config.get("speculators_model_type")
    if kind in ("dspark", "dflash") or "Qwen3DSparkModel" in architectures:
        drafter, order = parallel_drafter(config, tensors, extra, target, folder)
        load_parallel(drafter, tensors, order)
    elif kind == "eagle3" or any(a in architectures for a in EAGLE3_ARCHITECTURES):
        drafter, order = eagle3_drafter(config, tensors, extra, target, folder)
        load_eagle3(drafter, tensors, order, "layers.0." if kind == "eagle3" else "midlayer.")
    else:
        raise CheckpointError(f"{folder}: config.json names no drafter layout this project reads (architectures "
                              f"{architectures}; it reads Qwen3DSparkModel, speculators dspark/dflash/eagle3 "
                              "and EAGLE-3)")  # fmt: skip
    check_borrowed(tensors, drafter, folder)
    drafter = drafter.to(model_device(target))
    return cast_keeping_rope(drafter, target.embed.weight.dtype).eval()


def load_any(path: str | Path, target: Transformer) -> Drafter:
    """A drafter from a checkpoint (the core's `load_drafter`) or from a folder in a serving engine's layout,
    with the CPU speed path swapped in (`cpu_speed.fast_on_cpu`)."""
    drafter = load_exported(path, target) if Path(path).is_dir() else load_checkpoint(path, target)
    return fast_on_cpu(drafter)


def get_drafter(
    name: str, target: Transformer, path: str | Path | None = None, target_name: str = "tiny"
) -> Drafter:
    """The core's `get_drafter` for the commands: `path` may also be an exported folder, and the drafter has the
    CPU speed path (`load_any`); `prompt-lookup` is the lab's drafter without weights."""
    if name == PromptLookupDrafter.name:
        if path is not None:
            raise CheckpointError(
                "prompt lookup copies from the text and has no weights: drop --drafter-checkpoint"
            )
        return PromptLookupDrafter(target.config.vocab_size)
    if name == "none" or name not in drafters.DRAFTER_NAMES:
        return drafters.get_drafter(name, target)  # `none`, or the core's one-line refusal
    path = drafters.drafter_path(name, path, target_name)
    return drafters.check_kind(load_any(path, target), name, path)
