"""Where the lab's commands write, and how: DSPARK_HOME and its folders, atomic writes, measurement caches,
checkpoints.

Everything the training and benchmark commands produce (corpus, token arrays, training runs, cached
profiles) goes under `DSPARK_HOME` (default `~/.cache/dspark`), never into git; the shipped artefacts are
read from `dspark.checkpoint` and written only through `--ship`.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import save_file

from dspark.checkpoint import ASSETS_DIR, config_path

T = TypeVar("T")


def resolved(path: str | Path) -> Path:
    """The file `path` names once symlinks are followed: writing there updates a link's target, where
    replacing the link itself would turn it into a plain file and leave the target as it was."""
    return Path(os.path.realpath(path))


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` (through symlinks: their target) by a temporary file in the target's folder,
    moved into place only when complete: an interrupted or failed write never leaves a half-written file.
    Returns the file written."""
    target = resolved(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # per process: two writers never share one
    try:
        tmp.write_text(text, encoding="utf-8")
        keep_mode(target, tmp)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def keep_mode(old: Path, new: Path) -> None:
    """Give `new` the permission bits of `old` when it exists, so replacing a file keeps who may read it."""
    try:
        os.chmod(new, stat.S_IMODE(old.stat().st_mode))
    except FileNotFoundError:
        pass


def plain_file_mode() -> int:
    """The permission bits `open()` gives a new file: 0o666 less the process's umask (0o644 under the usual
    0o022). A file made by a library through a private temporary (safetensors: 0o600) is set to this."""
    umask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    return 0o666 & ~umask


class CacheError(ValueError):
    """A cache file under DSPARK_HOME that cannot be read; the message names it and the way out."""


def read_cache(path: Path, key: dict, build: Callable[[dict], T | None], refresh: str) -> T | None:
    """`build(record)` of the JSON record cached in `path` when it was made for `key`; None when there is
    none, it was made for another key, or `build` returns None (measure again). A file that is not such a
    record (empty, cut short, edited) raises `CacheError` naming it and `refresh`, the command that measures
    it again, instead of a traceback or a bare JSON error nobody can place."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise TypeError(f"a JSON {type(record).__name__}, not an object")
        return build(record) if record.get("key") == key else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = "empty" if not path.stat().st_size else f"not JSON: {exc}"
    except (KeyError, TypeError, ValueError) as exc:  # a field missing, of the wrong type or out of range
        why = f"no {exc} field" if isinstance(exc, KeyError) else str(exc)
    raise CacheError(f"cache file {path} is unreadable ({why}): pass --refresh to measure it again "
                     f"({refresh}) or delete the file")  # fmt: skip


_unsaved: set[str] = set()  # the DSPARK_HOME folders already said to be unwritable (said once each)


def write_cache(path: Path, record: dict) -> bool:
    """Store a measurement's JSON `record` in the cache file `path` (under DSPARK_HOME). A cache that cannot
    be written costs the cache, not the answer: the measurement is used for this run, the file is not saved,
    and one note on stderr says so (once per folder). Returns whether it was saved."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(record) + "\n")
        return True
    except OSError as exc:
        if str(path.parent) not in _unsaved:
            _unsaved.add(str(path.parent))
            why = exc.strerror or type(exc).__name__
            print(f"note: cannot save measurements under {path.parent} ({why}); this run uses them unsaved and "
                  "the next one measures again (set DSPARK_HOME to a writable folder to keep them)", file=sys.stderr)  # fmt: skip
        return False


def dspark_home() -> Path:
    """Root for generated data and runs; override with the DSPARK_HOME variable. Set but empty counts as
    unset: `Path("")` is the current folder, where a 98 MB model would otherwise land."""
    return Path(os.environ.get("DSPARK_HOME") or Path.home() / ".cache" / "dspark")


def target_home(target_name: str = "tiny") -> Path:
    """Where data made with a target lives: DSPARK_HOME for the shipped tiny target, DSPARK_HOME/<name> for a
    named pretrained one (its responses, feature caches, runs)."""
    return dspark_home() if target_name == "tiny" else dspark_home() / target_name


def training_data(
    target_name: str, responses: str | None = None, features_dir: str | None = None
) -> tuple[str, str]:
    """(the responses file, the feature-cache root) a drafter of this target trains from: the ones given, else
    `responses.jsonl` and `features/` under `target_home`."""
    home = target_home(target_name)
    return responses or str(home / "responses.jsonl"), features_dir or str(home / "features")


def data_dir() -> Path:
    return dspark_home() / "data"


def runs_dir() -> Path:
    return dspark_home() / "runs"


def inside_package(path: str | Path) -> bool:
    """Whether `path` lies inside the installed `dspark` package (its shipped assets): the commands read those
    files and never write them but through `--ship` (`dspark.lab.cli.refuse_clobber` refuses an --out or --json there)."""
    package, where = ASSETS_DIR.parent, Path(path).resolve()
    return where == package or package in where.parents


def save_checkpoint(
    model: torch.nn.Module,
    config,  # a dataclass with to_dict(): ModelConfig or a drafter's
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    meta: dict | None = None,
) -> None:
    """Write `path` (.safetensors) and its `.json` twin. Tied weights are stored once. A symlinked `path` stays
    a link: the weights replace its target, the twin goes beside the name given (where `read_checkpoint(path)`
    looks for it). Both get the mode of the file they replace, or a new file's (`plain_file_mode`)."""
    path = Path(path)
    weights = resolved(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # tied to a tensor already written
            continue
        seen.add(tensor.data_ptr())
        tensor = tensor.detach().cpu()  # safetensors writes host memory (a model trained on a GPU)
        tensors[name] = (
            tensor.to(dtype) if tensor.is_floating_point() else tensor
        ).contiguous()  # ids stay ints
    tmp = weights.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    # safetensors writes 0o600; the weights get what their JSON twin gets (a new file's mode, or the old one's)
    os.chmod(tmp, plain_file_mode())
    keep_mode(weights, tmp)
    tmp.replace(weights)  # atomic: a crash never leaves half a checkpoint
    record = {"config": config.to_dict(), "meta": meta or {}}
    write_text_atomic(config_path(path), json.dumps(record, indent=2) + "\n")
