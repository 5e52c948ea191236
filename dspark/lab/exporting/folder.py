"""Writing an export folder, all or nothing.

`export_drafter` asks the layout's module (deepspec.py, speculators.py, eagle3.py) for config.json, the
tensors and README.md -- a refusal is a ValueError before anything touches the disk -- then writes them
with `dspark.json` (what the layouts do not keep: the drafter's own config, its draft ids in their own
order) into a temporary folder beside the destination (`.NAME.export-*`), and renames it into place
only when every file is written. An export that fails or is interrupted half-way removes its temporary
folder and leaves the destination as it was; with `replace`, a folder already there is swapped out in
the same way and deleted only after the new one is in place -- and only a folder this command wrote (its
dspark.json says `"written_by": "python -m dspark.export"`) or an empty one: anything else is refused.

What this file does not do: parse the command line (dspark/lab/commands/export.py) or name tensors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from dspark.lab.draft_vocab import vocab_of
from dspark.lab.exporting import deepspec, eagle3, speculators
from dspark.lab.exporting.fields import ExportInfo

FORMATS = {m.NAME: m for m in (deepspec, speculators, eagle3)}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
WEIGHTS = "model.safetensors"
PROVENANCE = "dspark.json"  # with WRITTEN_BY in it: the marker that lets --force replace the folder
WRITTEN_BY = "python -m dspark.export"


def is_export(folder: Path) -> bool:
    """Whether `folder` is one this command wrote: its dspark.json carries the marker `provenance` writes."""
    try:
        record = json.loads((folder / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and record.get("written_by") == WRITTEN_BY


def check_replaceable(dest: Path) -> None:
    """Refuse (one-line ValueError) to replace `dest` unless it is absent, empty, or an earlier export."""
    dest = Path(dest)
    if not dest.exists():
        return
    if not dest.is_dir():
        raise ValueError(f"{dest} is a file, not an export folder; --force replaces only a folder this command "
                         "wrote: choose another --out")  # fmt: skip
    try:
        empty = not any(dest.iterdir())
    except OSError:
        empty = False
    if not empty and not is_export(dest):
        raise ValueError(f"{dest} is not a folder this command wrote (no {PROVENANCE} written by `{WRITTEN_BY}`); "
                         "--force replaces only an earlier export or an empty folder: choose another --out")  # fmt: skip


@contextmanager
def staged_folder(dest: Path, replace: bool = False) -> Iterator[Path]:
    """A fresh temporary folder beside `dest` to fill; renamed to `dest` on success, removed on any failure.
    With `replace`, only an earlier export or an empty folder may be there (`check_replaceable`)."""
    dest = Path(dest)
    if dest.exists() and not replace:
        raise ValueError(f"{dest} already exists; pass --force to replace it, or choose another --out")
    check_replaceable(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.export-", dir=dest.parent))
    try:
        yield stage
        readable(stage)
        old = None
        if (
            dest.exists()
        ):  # swap: the old folder moves aside first, and goes only once the new one is in place
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            dest.replace(old / dest.name)
        stage.replace(dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def readable(folder: Path) -> None:
    """The permissions an ordinary folder gets (mkdtemp makes it private, safetensors its file too)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def write_weights(folder: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """model.safetensors: floating tensors in `dtype`, ids (d2t int64, t2d bool) as they are; each its own
    copy (a tied target's embedding and LM head are one tensor, which safetensors refuses to write twice)."""
    cast = {
        k: v.to(dtype if v.is_floating_point() else v.dtype, copy=True).contiguous()
        for k, v in tensors.items()
    }
    save_file(cast, str(folder / WEIGHTS), metadata={"format": "pt"})  # "pt": what transformers expects


def write_json(path: Path, record: dict) -> None:
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def provenance(drafter, fmt: str, info: ExportInfo) -> dict:
    """dspark.json: the drafter's own config and draft-id order, for reading the folder back exactly."""
    record = {"written_by": WRITTEN_BY, "format": fmt, "drafter": drafter.config.to_dict(),
              "target": info.target_name, "tap_layers": list(drafter.target.config.tap_layers),
              "source": info.source}  # fmt: skip
    if vocab_of(drafter).size:
        record["draft_ids"] = vocab_of(drafter).ids.tolist()  # most frequent first: the order sampling walks
    return record


def export_drafter(drafter, fmt: str, dest: str | Path, info: ExportInfo, replace: bool = False) -> Path:
    """Write `drafter` in layout `fmt` to the folder `dest` (atomically, see the module docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if info.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {info.dtype!r}; choose one of {', '.join(DTYPES)}")
    dest = Path(dest)
    info = dataclasses.replace(info, drafter_dir=str(dest))  # the README's commands name the folder
    config, tensors, readme = FORMATS[fmt].build(drafter, info)  # refusals happen here, before any file
    with staged_folder(dest, replace) as stage:
        write_json(stage / "config.json", config)
        write_weights(stage, tensors, DTYPES[info.dtype])
        write_json(stage / PROVENANCE, provenance(drafter, fmt, info))
        (stage / "README.md").write_text(readme, encoding="utf-8")
    return dest
