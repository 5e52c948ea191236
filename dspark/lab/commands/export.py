"""`python -m dspark.export`: a drafter trained here -> a folder vLLM, SGLang or llama.cpp loads.

    python -m dspark.export --drafter dspark --drafter-checkpoint run/drafter_dspark.safetensors \\
        --model smollm2-135m --format deepspec --out exported/dspark

Formats (--format; default: deepspec for the parallel kinds, eagle3 for eagle):
  deepspec     DeepSpec's Qwen3DSparkModel: vLLM `--speculative-config '{"method": "dspark", ...}'`, SGLang
               `--speculative-algorithm DSPARK`, llama.cpp `--spec-type draft-dspark` (dflash and dspark);
               the target's whole vocabulary only: DeepSpec sizes lm_head by vocab_size and reads no d2t
  speculators  vllm-project/speculators (dspark, dflash as dspark with markov_rank 0, eagle): `vllm serve DIR`;
               llama.cpp reads its DSpark too; a reduced draft vocabulary (`train drafter --draft-vocab`) fits
  eagle3       EAGLE-3 for a Llama target (`midlayer.*`): vLLM `"method": "eagle3"`, SGLang EAGLE3

The folder holds config.json, model.safetensors (--out-dtype, default bfloat16), README.md (the engine command
lines, the mask token, the layer ids) and dspark.json (what lets `--drafter-checkpoint DIR` read it back
exactly). Written atomically: beside --out first, renamed into place at the end. --force replaces only a
folder this command wrote (its dspark.json says so) or an empty one; the README's command lines quote the
target and the folder for the shell.

What a format cannot hold is refused in one line: the deepspec and speculators layouts need q/k RMSNorm
in every drafter layer (`train drafter --qk-norm`) and a vanilla Markov head (no RNN head: the engines do
not serve it); eagle3 needs EAGLE-3's own layer (`train drafter --kind eagle --eagle3-layer`); no layout
holds mtp, a drafter reading the target's final hidden state, or a tap on the target's last layer; deepspec
refuses a reduced draft vocabulary (export it with --format speculators).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark.checkpoint import config_path
from dspark.drafters import DRAFTER_NAMES, default_path
from dspark.lab import cli
from dspark.lab.cli import UsageError
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.exporting.fields import KNOWN_TARGETS, ExportInfo
from dspark.lab.exporting.folder import DTYPES, FORMATS, check_replaceable, export_drafter


def parse(argv: list[str] | None):
    parser = cli.command_parser("python -m dspark.export", __doc__)
    cli.add_target(parser, tokenizer=True, pretrained=True)
    parser._option_string_actions["--dtype"].help = (
        "the target's weights as loaded (default here: float32, so that the embedding and LM-head rows the "
        "folder carries are the target's exactly before --out-dtype rounds them)"
    )
    kinds = [n for n in DRAFTER_NAMES if n != "none"]
    cli.add_option(parser, "--drafter", "dspark", "which drafter kind to export", choices=kinds)
    parser.add_argument("--drafter-checkpoint", metavar="PATH",
                        help="its weights: a .safetensors checkpoint or an exported folder (default: the shipped "
                        "drafter of that kind for the target)")  # fmt: skip
    parser.add_argument("--format", choices=tuple(FORMATS), default=None,
                        help="the layout (default: deepspec for dflash/dspark, eagle3 for eagle)")  # fmt: skip
    cli.add_outputs(parser, "the folder to write (required; it must not exist unless --force)", json=None)
    parser.add_argument("--force", action="store_true",
                        help="replace a folder already at --out: only one this command wrote (its dspark.json says "
                        "so) or an empty one")  # fmt: skip
    parser.add_argument("--out-dtype", choices=tuple(DTYPES), default="bfloat16",
                        help="dtype of the exported weights (default: %(default)s, what the engines serve)")  # fmt: skip
    parser.add_argument("--target-ref", metavar="ID|DIR",
                        help="the target as the engine should load it, written into config.json (speculators' "
                        "verifier) and the README's commands (default: the Hugging Face id of a known --model, "
                        "else PATH/TO/TARGET)")  # fmt: skip
    return parser.parse_args(argv)


def training_meta(checkpoint: Path) -> dict:
    """The drafter checkpoint's training record (its JSON twin's meta), {} for a folder or without one."""
    twin = config_path(checkpoint)
    if checkpoint.is_dir() or not twin.is_file():
        return {}
    try:
        meta = json.loads(twin.read_text(encoding="utf-8")).get("meta", {})
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.out is None:
        raise UsageError("where to? give the folder to write with --out DIR")
    # before any work: not the shipped assets, nor a folder holding --drafter-checkpoint; and --force replaces
    # only an earlier export or an empty folder, nothing else
    cli.refuse_clobber(args, replaced=("out",))
    if Path(args.out).exists() and not args.force:
        raise UsageError(f"{args.out} already exists; pass --force to replace it, or choose another --out")
    try:
        check_replaceable(Path(args.out))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.dtype = args.dtype or "float32"  # the target's weights are copied (embedding, LM-head rows): exactly
    tokenizer, target, target_name = cli.load_target(args, torch.device("cpu"))
    checkpoint = (
        Path(args.drafter_checkpoint) if args.drafter_checkpoint else default_path(args.drafter, target_name)
    )
    drafter = get_drafter(args.drafter, target, checkpoint, target_name)
    fmt = args.format or ("eagle3" if drafter.name == "eagle" else "deepspec")
    hf_id, context, note = KNOWN_TARGETS.get(target_name, (None, 0, ""))
    mask_id = getattr(drafter.config, "mask_id", None)
    info = ExportInfo(
        target_name=target_name, target_ref=args.target_ref or hf_id or "PATH/TO/TARGET", context=context,
        mask_text=(tokenizer.backend.id_to_token(mask_id) or "") if mask_id is not None else "",
        tokenizer_vocab=tokenizer.vocab_size, source=str(checkpoint), dtype=args.out_dtype,
        meta=training_meta(checkpoint), note=note,
    )  # fmt: skip
    try:
        out = export_drafter(drafter, fmt, args.out, info, replace=args.force)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"wrote {out} ({fmt} layout of the {drafter.name} drafter); {out / 'README.md'} says how to serve it"
    )
